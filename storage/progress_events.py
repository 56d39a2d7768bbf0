"""How components report fine-grained progress (files ingested, epochs trained) to whoever runs them.

Each event is a record on the `imagepipe.progress` logger; runs/progress.py listens there and
turns events into bars or JSON lines for `imagepipe run`. Elsewhere (Vertex, Kubeflow) they are plain
log lines. Plain Python, so that components/ and trainer/ report without importing pipeline/.
"""

import logging

LOGGER = "imagepipe.progress"


def progress_event(kind: str, done: int, total: int, **detail) -> None:
    """`kind` ("ingest", "train") advanced to done/total; `detail` travels with the event."""
    logging.getLogger(LOGGER).info(
        "%s %d/%d", kind, done, total, extra={"imagepipe_event": {"kind": kind, "done": done, "total": total, **detail}}
    )
