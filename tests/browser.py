"""Opens a page in headless Chromium (Debian's `chromium`) over the DevTools protocol.

Returns what a person would see: console errors, uncaught exceptions, failed
loads, the result of a JavaScript check, and a full-page screenshot. .ci/run
installs Chromium when it is absent; elsewhere, tests that need it are skipped
unless IMAGEPIPE_REQUIRE_BROWSER is set (as CI sets it).
"""

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any, Dict, List

import pytest

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,900",
    "--remote-debugging-port=0",
]


def chromium_or_skip() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("IMAGEPIPE_REQUIRE_BROWSER"):
        pytest.fail("chromium is not installed (apt-get install chromium); CI requires it")
    pytest.skip("chromium is not installed (apt-get install chromium)")


class _Page:
    def __init__(self, ws_url: str):
        import websocket

        self._ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self._next = 0
        self.events = []

    def call(self, method: str, **params) -> Dict[str, Any]:
        self._next += 1
        self._ws.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == self._next:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(json.loads(self._ws.recv()))

    def close(self) -> None:
        self._ws.close()


@contextlib.contextmanager
def _chromium_page():
    """A page of a fresh headless Chromium, its domains enabled; the browser is gone after."""
    browser = chromium_or_skip()
    profile = tempfile.mkdtemp(prefix="chromium-")
    proc = subprocess.Popen(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("chromium did not start")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = _Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                page.call(f"{domain}.enable")
            yield page
        finally:
            page.close()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _screenshot(page: _Page, screenshot: str) -> None:
    size = page.call(
        "Runtime.evaluate",
        returnByValue=True,
        expression="[document.documentElement.scrollWidth, document.documentElement.scrollHeight]",
    )
    width, height = size["result"]["value"]
    page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
    with open(screenshot, "wb") as f:
        f.write(base64.b64decode(shot["data"]))


def open_page(url: str, check_js: str, screenshot: str) -> Dict[str, Any]:
    """Loads `url`, runs `check_js` (an expression returning JSON-able data), saves a screenshot."""
    with _chromium_page() as page:
        page.call("Page.navigate", url=url)
        page.wait_for("Page.loadEventFired")
        checked = page.call("Runtime.evaluate", expression=check_js, returnByValue=True)
        _screenshot(page, screenshot)
        events = page.events
    return {**_seen(events, checked), "screenshot": screenshot}


def drive_page(url: str, steps: List[tuple], check_js: str, screenshot: str) -> Dict[str, Any]:
    """Loads `url` and plays `steps` as a person at the keyboard would: ("wait", JS expression that becomes true),
    ("key", a key name as KeyboardEvent.key gives it); then runs `check_js` and saves a screenshot."""
    with _chromium_page() as page:
        page.call("Page.navigate", url=url)
        page.wait_for("Page.loadEventFired")
        for kind, value in steps:
            if kind == "wait":
                deadline = time.monotonic() + 30
                while not page.call("Runtime.evaluate", expression=f"Boolean({value})", returnByValue=True)[
                    "result"
                ].get("value"):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the page never showed {value}")
                    time.sleep(0.1)
            else:
                text = value if len(value) == 1 else ""
                for event in ("keyDown", "keyUp"):
                    page.call(
                        "Input.dispatchKeyEvent",
                        type=event,
                        key=value,
                        text=text if event == "keyDown" else "",
                        code=_KEY_CODES.get(value, ""),
                    )
        checked = page.call("Runtime.evaluate", expression=check_js, returnByValue=True)
        _screenshot(page, screenshot)
        events = page.events
    return {**_seen(events, checked), "screenshot": screenshot}


_KEY_CODES = {"Enter": "Enter", "Escape": "Escape", "ArrowRight": "ArrowRight", "ArrowLeft": "ArrowLeft"}


def _seen(events, checked) -> Dict[str, Any]:
    console_errors = [
        e["params"]["args"]
        for e in events
        if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")
    ]
    log_errors = [
        e["params"]["entry"]["text"]
        for e in events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]
    exceptions = [e["params"]["exceptionDetails"] for e in events if e.get("method") == "Runtime.exceptionThrown"]
    failed_loads = [e["params"] for e in events if e.get("method") == "Network.loadingFailed"]
    requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    return {
        "errors": console_errors + log_errors + exceptions + failed_loads,
        "requests": requests,
        "check": checked["result"].get("value"),
    }
