"""One run at a time per pipeline: a lock file beside the pipeline's ML Metadata store.

Two `imagepipe run` on one root and pipeline (a cron job overlapping a manual run,
two teammates on a shared root) would otherwise interleave in one SQLite store and
read each other's results as their own. The later run waits for the earlier one,
saying so. The operating system releases the lock when its holder exits, however
it exits, so a run that shows as running while nobody holds the lock was killed:
run_summary reports it as interrupted.

Plain Python (fcntl): `imagepipe runs` uses it without importing TFX.
"""

import contextlib
import datetime
import fcntl
import os
from typing import Callable, Iterator, Optional

LOCK_FILE = "run.lock"


def lock_path(metadata_path: str) -> str:
    return os.path.join(os.path.dirname(metadata_path), LOCK_FILE)


@contextlib.contextmanager
def hold(metadata_path: str, on_wait: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Holds the pipeline's lock for the block; if another run holds it, tells on_wait and waits."""
    path = lock_path(metadata_path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                on_wait(f"another run of this pipeline is in progress ({holder}); waiting for it to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {started}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def held(metadata_path: str) -> bool:
    """Whether a run of this pipeline is in progress now (some process holds the lock)."""
    path = lock_path(metadata_path)
    if not os.path.exists(path):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
