"""`imagepipe review`'s web page: the items of a run, decided with the keyboard, each decision appended to the
review file at once.

Safe by construction: it listens on 127.0.0.1 only; every request needs the random token of its URL (compared in
constant time) and a Host of 127.0.0.1 or localhost (a page elsewhere cannot reach it by DNS rebinding); images are
served by item number only, from the run's listed files (a file under the data root must resolve inside it), as
bounded thumbnails decoded under ingestion's pixel bound; the page sets every text with textContent (names are
never markup) and the server sends a Content-Security-Policy that allows nothing but its own script and images.
"""

import hashlib
import hmac
import http.server
import json
import os
import secrets
import threading
import urllib.parse
from typing import Any, Dict, List, Optional

from images.bounds import MAX_PIXELS  # ingestion's bound: a file it refuses, never decoded
from images.finding.listing import label_set, labels_of
from images.image_check import thumbnail
from review.items import Items
from storage import files as fs
from storage import review_file

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE, SCRIPT = os.path.join(HERE, "page.html"), os.path.join(HERE, "page.js")
THUMBNAIL = 256  # px a side in the list
LARGE = 1024  # px a side when enlarged
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self'; connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


class Review:
    """The items, the classes to relabel to, and the review file; decide() appends and remembers."""

    def __init__(self, items: Items, classes: List[str], log: review_file.Log, multi_label: bool = False):
        self.items, self.classes, self.log, self.multi_label = items, classes, log, multi_label
        self.decided = {d.path: d for d in log.decisions.values()}  # reopened: what was decided
        self._lock = threading.Lock()

    def state(self) -> Dict[str, Any]:
        shown = [{k: v for k, v in item.items() if k != "file"} for item in self.items.items]
        for item in shown:
            done = self.decided.get(item["path"])
            item["decision"] = {"action": done.action, "new_label": done.new_label} if done else None
        return {"items": shown, "classes": self.classes, "multi_label": self.multi_label, "file": self.log.path}

    def decide(self, number: int, action: str, new_label: str = "") -> Dict[str, Any]:
        if action not in review_file.ACTIONS:
            raise ValueError(f"action {action!r}: use {', '.join(review_file.ACTIONS)}")

        item = self.items.items[number]
        if action == "relabel":
            labels = labels_of(new_label) if self.multi_label else [new_label]
            if any(label not in self.classes for label in labels) or not (labels or self.multi_label):
                raise ValueError(f"relabel to {new_label!r}: not one of the run's classes")
            new_label = label_set(labels) if self.multi_label else new_label  # multi-label: none is a label set
        if not item["key"] and not self._readable(item["file"]):
            raise ValueError("this image is outside the data root")
        key = item["key"] or hashlib.sha256(fs.read_bytes(item["file"])).hexdigest()
        decision = review_file.Decision(
            review_file.now(),
            key,
            item["path"],
            action,
            item["given"],
            new_label if action == "relabel" else "",
            "; ".join(item["reasons"])[:500],
        )
        with self._lock:
            self.log.append(decision)
            self.decided[item["path"]] = decision
        return {"action": action, "new_label": decision.new_label}

    def image(self, number: int, size: int) -> Optional[bytes]:
        """A JPEG of the item's image at most `size` a side, or None when it cannot be read or decoded."""
        item = self.items.items[number]
        if not self._readable(item["file"]):
            return None
        try:
            data = fs.read_bytes(item["file"])
        except Exception:  # noqa: BLE001 - gone since the run (local or Cloud Storage): shown as not shown
            return None
        return thumbnail(data, size, MAX_PIXELS, "JPEG")

    def _readable(self, file: str) -> bool:
        """A listed file under the data root must resolve inside it (a link out of it is not followed)."""
        root = self.items.data_root
        if not root or fs.is_remote(file) or not file.startswith(fs.join(root, "")):
            return True  # a predicted file, or on Cloud Storage: listed by predict or the run, served as listed
        real_root = os.path.realpath(root)
        return os.path.commonpath([real_root, os.path.realpath(file)]) == real_root


def serve(review: Review, port: int = 0) -> http.server.ThreadingHTTPServer:
    """The server (not yet serving: call serve_forever), with .url: the page's address and token."""
    token = secrets.token_urlsafe(24)
    page, script = (open(path, encoding="utf-8").read().encode("utf-8") for path in (PAGE, SCRIPT))
    page = page.replace(b'src="page.js"', f'src="page.js?token={token}"'.encode("ascii"))  # url-safe token
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    # Each request's handler reads what it answers with from its server.
    server.review, server.token, server.page, server.script = review, token, page, script
    server.url = f"http://127.0.0.1:{server.server_address[1]}/?token={token}"
    return server


class _Handler(http.server.BaseHTTPRequestHandler):
    """The page's requests; the review, token, page and script are its server's (serve)."""

    server_version = "imagepipe-review"

    def log_message(self, *args):  # quiet: the terminal shows the URL and decisions only
        pass

    def _allowed(self) -> Optional[urllib.parse.ParseResult]:
        url = urllib.parse.urlparse(self.path)
        given = urllib.parse.parse_qs(url.query).get("token", [""])[0]
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost") or not hmac.compare_digest(
            given.encode(), self.server.token.encode()
        ):
            self._send(403, b"forbidden", "text/plain")
            return None
        return url

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/favicon.ico":  # the browser asks without the token: nothing to give
            self._send(204, b"", "text/plain")
            return
        url = self._allowed()
        if url is None:
            return
        review = self.server.review
        if url.path == "/":
            self._send(200, self.server.page, "text/html; charset=utf-8")
        elif url.path == "/page.js":
            self._send(200, self.server.script, "text/javascript; charset=utf-8")
        elif url.path == "/state":
            self._send(200, json.dumps(review.state()).encode("utf-8"), "application/json")
        elif url.path.startswith("/image/"):
            number = _number(url.path.rsplit("/", 1)[1], len(review.items.items))
            large = "large" in urllib.parse.parse_qs(url.query)
            body = review.image(number, LARGE if large else THUMBNAIL) if number is not None else None
            if body is None:
                self._send(404, b"cannot show this image", "text/plain")
            else:
                self._send(200, body, "image/jpeg")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self):
        url = self._allowed()
        if url is None:
            return
        if url.path != "/decide":
            self._send(404, b"not found", "text/plain")
            return
        try:
            body = self._decide()
        except (ValueError, TypeError, OSError) as e:
            self._send(400, json.dumps({"error": str(e)}).encode("utf-8"), "application/json")
            return
        except RecursionError:  # JSON nested past Python's limit
            self._send(
                400, json.dumps({"error": "a decision is a flat JSON object"}).encode("utf-8"), "application/json"
            )
            return
        self._send(200, json.dumps(body).encode("utf-8"), "application/json")

    def _decide(self) -> Dict[str, Any]:
        """The posted decision, applied: its answer, or ValueError (TypeError, OSError) for one it cannot take."""
        review = self.server.review
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= 65536:
            raise ValueError("a decision is a small JSON object")
        asked = json.loads(self.rfile.read(length))
        if not isinstance(asked, dict):
            raise ValueError("a decision is a JSON object: item, action, new_label")
        number = _number(str(asked.get("item")), len(review.items.items))
        if number is None:
            raise ValueError("no such item")
        return review.decide(number, str(asked.get("action")), str(asked.get("new_label") or ""))


ITEM_DIGITS = 9  # an item's number has at most this many digits (int() of 5,000 of them raises)


def _number(text: str, count: int) -> Optional[int]:
    """The item number `text` names (ASCII digits: '²' is a digit to str.isdigit, not to int), or None."""
    if not (text.isascii() and text.isdigit() and len(text) <= ITEM_DIGITS):
        return None
    return int(text) if int(text) < count else None
