"""Live progress of a local run: components starting and finishing, ingestion and training progress.

Two sources, both independent of how TFX runs the components:
  - ML Metadata, polled by a thread: an execution appears when a component starts
    (component_started) and changes state when it finishes (component_finished:
    ran, cached or FAILED; a cached one may show up finished without a start);
  - the `imagepipe.progress` logger, to which components report fine-grained
    progress (files ingested, epochs trained) with storage/progress_events.py.

Output modes: "human" (bars on a terminal, lines elsewhere), "json" (one JSON
object per line, for scripts) and "quiet" (nothing until the final summary).
"""

import json
import logging
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

from storage.progress_events import LOGGER

MODES = ("human", "json", "quiet")


class Printer:
    """Turns events into output lines (or JSON objects)."""

    def __init__(self, mode: str = "human", stream=None):
        self.mode = mode
        self.stream = stream or sys.stdout
        self._started = time.monotonic()
        self._bar_open = False
        self._last_step: Dict[str, int] = {}
        self._lock = threading.Lock()

    def restart_clock(self) -> None:
        """Times count from now: from the run's start, not from before it waited for its turn."""
        self._started = time.monotonic()

    def emit(self, event: Dict[str, Any]) -> None:
        with self._lock:
            event = {"time": round(time.monotonic() - self._started, 2), **event}
            if self.mode == "json":
                self._write(json.dumps(event, default=str) + "\n")
            elif self.mode == "human":
                self._human(event)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self, text: str) -> None:
        if self._bar_open:
            self._write("\n")
            self._bar_open = False
        self._write(text + "\n")

    def _human(self, event: Dict[str, Any]) -> None:
        clock = time.strftime("%H:%M:%S", time.gmtime(event["time"]))
        kind = event["event"]
        if kind == "run_prepared":
            self._prepared(event)
        elif kind == "run_started":
            self._line(f"[{clock}] loading TensorFlow and TFX, compiling the pipeline ...")
        elif kind == "component_started":
            self._line(f"[{clock}] {event['component']} ...")
        elif kind == "component_finished":
            took = "" if event["state"] == "cached" else f" in {event['seconds']:.1f} s"
            self._line(f"[{clock}] {event['component']} {event['state']}{took}")
        elif kind == "progress":
            self._progress(event)

    def _prepared(self, event: Dict[str, Any]) -> None:
        """What the run reads and where it writes, before it starts."""
        sample = " (the digits sample)" if event["sample"] else ""
        self._line(f"imagepipe on the {event['stack']}")
        self._line(
            f"imagepipe: pipeline {event['pipeline']!r} on {event['source']}{sample}: "
            f"{event['files']:,} files, {event['classes']:,} classes, {event['layout']} layout"
        )
        self._line(f"  model:     {event['model']}")
        self._line(f"  artifacts: {event['artifacts']}\n  metadata:  {event['metadata']}")

    def note(self, message: str) -> None:
        """A line about the run itself (why it waits for its turn): on standard error where standard output is JSON,
        else beside the progress."""
        with self._lock:
            if self.mode == "json":
                print(f"imagepipe: {message}", file=sys.stderr, flush=True)
            else:
                self._line(f"imagepipe: {message}")

    def _progress(self, event: Dict[str, Any]) -> None:
        if not event["total"]:  # a count with no known end (the features step's images)
            self._count(event)
            return
        done, total = event["done"], max(1, event["total"])
        label = {"ingest": "files", "train": "epochs at most", "tune": "trials"}.get(event["kind"], event["kind"])
        extra = ""
        if event["kind"] == "train" and "val_accuracy" in event:
            extra = f"  loss {event.get('loss', 0):.3f}  held-out accuracy {event['val_accuracy']:.3f}"
            if "val_balanced_accuracy" in event:  # imbalanced classes: what training follows
                extra += f"  balanced {event['val_balanced_accuracy']:.3f}"
            if "val_auc_pr" in event:  # multi-label: what training follows (val_accuracy: over label bits)
                extra = (
                    f"  loss {event.get('loss', 0):.3f}  held-out macro AUC-PR {event['val_auc_pr']:.3f}"
                    f"  bit accuracy {event['val_accuracy']:.3f}"
                )
        if event["kind"] == "tune" and "best" in event:
            shown = {"val_auc_pr": "held-out macro AUC-PR", "val_balanced_accuracy": "balanced accuracy"}.get(
                event.get("objective"), "held-out accuracy"
            )
            extra = f"  best {shown} {event['best']:.3f}"
        if self.stream.isatty():
            filled = int(30 * done / total)
            self._write(
                f"\r    {event['kind']:<7}[{'#' * filled}{'.' * (30 - filled)}] {done:,}/{total:,} {label}{extra}"
            )
            self._bar_open = done < total
            if done >= total:
                self._write("\n")
            return
        # Not a terminal: a line per 10% (every epoch for training, every trial for a search).
        step = done if event["kind"] in ("train", "tune") else int(10 * done / total)
        if self._last_step.get(event["kind"]) != step:
            self._last_step[event["kind"]] = step
            self._line(f"    {event['kind']}: {done:,}/{total:,} {label}{extra}")

    def _count(self, event: Dict[str, Any]) -> None:
        label = {"features": "images through the backbone or the cache"}.get(event["kind"], "done")
        if self.stream.isatty():
            self._write(f"\r    {event['kind']:<7}{event['done']:,} {label}")
            self._bar_open = True
            return
        step = event["done"].bit_length()  # a line each time the count doubles
        if self._last_step.get(event["kind"]) != step:
            self._last_step[event["kind"]] = step
            self._line(f"    {event['kind']}: {event['done']:,} {label}")


class _LogHandler(logging.Handler):
    def __init__(self, sink: Callable[[Dict[str, Any]], None]):
        super().__init__(logging.INFO)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "imagepipe_event", None)
        if event:
            self._sink({"event": "progress", **event})


class MetadataWatcher(threading.Thread):
    """Polls ML Metadata for the executions of the run started after `since_ms`."""

    def __init__(
        self, metadata_path: str, since_ms: int, sink: Callable[[Dict[str, Any]], None], interval: float = 0.3
    ):
        super().__init__(daemon=True)
        self._path, self._since, self._sink, self._interval = metadata_path, since_ms, sink, interval
        self._done = threading.Event()
        self._seen: Dict[int, str] = {}
        self._names: Dict[int, str] = {}

    def run(self) -> None:
        while not self._done.wait(self._interval):
            self.poll()
        self.poll()

    def stop(self) -> None:
        self._done.set()
        self.join()

    def poll(self) -> None:
        from runs import run_store  # ML Metadata (~0.2 s): the CLI imports this module at start-up

        try:
            store = run_store.open_store(self._path)
            run = run_store.newest_run(store, self._since)
            if run is None:
                return
            executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
            names = {e.id: run_store.node_name(store, e) for e in executions if e.id not in self._seen}
        except Exception:  # noqa: BLE001 - the store is being written or not created yet: next poll
            return
        for execution in executions:
            state = run_store.state_name(execution)
            previous = self._seen.get(execution.id)
            if previous == state:
                continue
            name = names.get(execution.id) or self._names[execution.id]
            self._names[execution.id] = name
            if previous is None and state in ("running", "new"):
                self._sink({"event": "component_started", "component": name})
            if state not in ("running", "new"):
                seconds = (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000
                self._sink(
                    {"event": "component_finished", "component": name, "state": state, "seconds": round(seconds, 2)}
                )
            self._seen[execution.id] = state


class Progress:
    """`with Progress(metadata_path, since_ms, printer):` around a run prints the progress of the
    run created after since_ms (milliseconds since the epoch)."""

    def __init__(self, metadata_path: str, since_ms: int, printer: Printer):
        self.printer = printer
        self._metadata_path = metadata_path
        self._since_ms = since_ms
        self._handler: Optional[_LogHandler] = None
        self._watcher: Optional[MetadataWatcher] = None

    def __enter__(self) -> "Progress":
        if self.printer.mode == "quiet":  # nothing to print: no polling of ML Metadata, no log handler
            return self
        logger = logging.getLogger(LOGGER)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # progress is shown here, not in the general log
        self._handler = _LogHandler(self.printer.emit)
        logger.addHandler(self._handler)
        self._watcher = MetadataWatcher(self._metadata_path, self._since_ms, self.printer.emit)
        self._watcher.start()
        self.printer.restart_clock()
        self.printer.emit({"event": "run_started"})
        return self

    def __exit__(self, *exc) -> None:
        if self._watcher is None:
            return
        self._watcher.stop()
        logging.getLogger(LOGGER).removeHandler(self._handler)
