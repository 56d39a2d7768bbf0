"""The review file: a CSV of decisions about images (keep, relabel, exclude), appended one whole line at a time.

    time,key,path,action,old_label,new_label,reason
    2026-11-27T00:41:07Z,3f5a...,cats/0042.jpg,relabel,cat,dog,likely label error (suggested dog at 0.91)

`key` is the image's content hash (SHA-256 of its bytes, as ingestion writes it), so a decision follows the image
whatever its name, and does not apply to a file that changed since. The last decision about an image is the one
that counts ("keep" undoes an earlier relabel). A line is written with its newline in one write and flushed to
disk before the page hears it was kept: a closed tab or a killed server loses nothing, and a line without its
newline (a machine that stopped mid-write) is never read back. `imagepipe run --review FILE` applies them
(components/example_gen/writing/batch_ingest.py); `imagepipe review` writes them (review/server.py).

Its cells are written spreadsheet-safe and read back as they were (storage/spreadsheet.py): a path or class named
`=HYPERLINK(...)` is text in a spreadsheet. A file a spreadsheet or a Windows editor saved again is read as well
(a UTF-8 byte-order mark, CRLF line ends); bytes that are not UTF-8 are kept as they are, so appending after them
never glues a decision to them. Only a regular file is read (a named pipe would block, /dev/zero never end).
"""

import csv
import datetime
import fcntl
import hashlib
import io
import os
from typing import Dict, NamedTuple, Optional

from storage import files as fs
from storage import user_files
from storage.errors import ConfigError
from storage.spreadsheet import cell_text, spreadsheet_safe

COLUMNS = ("time", "key", "path", "action", "old_label", "new_label", "reason")
HEADER = ",".join(COLUMNS) + "\n"
ACTIONS = ("keep", "relabel", "exclude")
BOM = "\ufeff"  # what Excel and Windows editors put before UTF-8 text
MAX_BYTES = 1 << 30  # a review file of 1 GiB holds millions of decisions: past it, not a review file
READ_OPTION, WRITE_OPTION = "--review", "--review-file"  # `run --review` reads it; `imagepipe review` writes it


class Decision(NamedTuple):
    time: str
    key: str
    path: str
    action: str  # keep | relabel | exclude
    old_label: str
    new_label: str  # relabel: the class (multi-label: the label set, ';'-separated); else ""
    reason: str  # why the image was listed for review


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _what_to_give(option: str) -> str:
    return (
        "give a file `imagepipe review` wrote, or a new path"
        if option == WRITE_OPTION
        else "give the file `imagepipe review` wrote"
    )


def check_local(path: str, option: str = READ_OPTION) -> bool:
    """Whether a local `path` exists (False: not yet); ConfigError, naming `option`, unless it is a regular file
    (user_files.check_source) of at most MAX_BYTES."""
    if not os.path.lexists(path):
        return False
    user_files.check_source(path, option, _what_to_give(option))
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise ConfigError(
            f"{option} {path}: {size / 2**30:.1f} GiB, more than a review file holds (at most "
            f"{MAX_BYTES >> 30} GiB); {_what_to_give(option)}"
        )
    return True


def _text(data: bytes) -> str:
    """The file's text: bytes that are not UTF-8 kept as they are (surrogate escapes), so that text offsets give
    back the bytes exactly."""
    return data.decode("utf-8", "surrogateescape")


def _body(text: str) -> Optional[str]:
    """The text after a review file's header (a byte-order mark and a CRLF line end accepted), or None."""
    text = text[len(BOM) :] if text.startswith(BOM) else text
    first, _, rest = text.partition("\n")
    return rest if first.rstrip("\r") == HEADER.strip() and len(text) > len(first) else None


def read(path: str, option: str = READ_OPTION) -> Dict[str, Decision]:
    """The last decision about each image (by content hash); {} when the file does not exist yet. A file that is
    not a review file is refused in one line naming `option` (imagepipe never appends to a file it did not
    write)."""
    if fs.is_remote(path):
        if not fs.exists(path):
            return {}
    elif not check_local(path, option):
        return {}
    text = _text(fs.read_bytes(path))
    if not text:
        return {}
    if _body(text) is None:
        raise ConfigError(
            f"{option} {path}: not a review file (its first line is not {HEADER.strip()!r}); " + _what_to_give(option)
        )
    found: Dict[str, Decision] = {}
    for line, decision, _ in _records(path, text, option):
        if decision is None:
            raise ConfigError(
                f"{option} {path}: line {line} is not a decision (a content hash, and an action of "
                f"{', '.join(ACTIONS)}); fix or remove that line"
            )
        found[decision.key] = decision
    return found


def _records(path: str, text: str, option: str = READ_OPTION):
    """(line number, the decision or None when the row is not one, offset after it) of each row after the header.
    A last row without its newline is a whole decision (saved by an editor) or was cut short mid-write: left out.
    Rows end at a newline only (a path may hold U+2028, which str.splitlines() takes for one)."""
    body = _body(text) or ""
    lines = [line + "\n" for line in body.split("\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    consumed = [0]

    def feed():
        for line in lines:
            consumed[0] += len(line)
            yield line

    reader = csv.reader(feed())
    start = len(text) - len(body)  # the header, with its byte-order mark and line end
    found = []
    try:
        for cells in reader:
            found.append((reader.line_num + 1, _decision(cells), start + consumed[0]))
    except csv.Error as e:
        raise ConfigError(f"{option} {path}: not a CSV file ({e}); {_what_to_give(option)}") from None
    if found and not text.endswith("\n") and found[-1][1] is None:
        found.pop()  # cut short
    return found


def _decision(cells) -> Optional[Decision]:
    if len(cells) != len(COLUMNS):
        return None
    # bytes that were not UTF-8 (kept for the offsets) read as replacement characters
    decision = Decision(
        *(cell_text(cell.encode("utf-8", "surrogateescape").decode("utf-8", "replace")) for cell in cells)
    )
    if (
        decision.action not in ACTIONS
        or len(decision.key) != 64
        or any(c not in "0123456789abcdef" for c in decision.key)
    ):
        return None
    return decision


def changes(decisions: Dict[str, Decision]) -> Dict[str, Decision]:
    """The decisions that change something (relabel, exclude), by content hash."""
    return {key: d for key, d in decisions.items() if d.action != "keep"}


def fingerprint(path: str) -> str:
    """What decides whether a cached ingestion still holds: the review file's decisions ("" without one)."""

    if not path:
        return ""
    found = changes(read(path))
    lines = sorted(f"{k}\t{d.action}\t{d.new_label}" for k, d in found.items())
    return "review:" + hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


class Log:
    """Appends decisions to a local review file, and holds it: one server a file (a second gets a one-line
    error). The file is created with its header; an existing file must be a review file."""

    def __init__(self, path: str):
        if fs.is_remote(path):
            raise ConfigError(
                f"{WRITE_OPTION} {path}: the review page writes a file on this machine; give a local "
                "path (copy it to gs:// for a scheduled run)"
            )
        self.path = os.path.abspath(path)
        # what was decided before; refuses a file that is not a regular review file
        self.decisions = read(self.path, WRITE_OPTION)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "a+b")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise ConfigError(
                f"--review-file {path}: another `imagepipe review` is serving this file; close it "
                "first (or give another --review-file)"
            ) from None
        if self._file.seek(0, os.SEEK_END) == 0:
            self._write(HEADER)
        else:  # a last row without its newline: ended if whole (read() reads it), dropped if cut short mid-write
            self._file.seek(0)
            text = _text(self._file.read())
            if not text.endswith("\n"):
                rows = _records(self.path, text, WRITE_OPTION)
                kept = rows[-1][2] if rows else len(text) - len(_body(text) or "")
                if kept >= len(text):
                    self._write("\n")
                else:  # the bytes of what is kept, exactly (surrogate escapes give back bytes that are not UTF-8)
                    self._file.truncate(len(text[:kept].encode("utf-8", "surrogateescape")))
                    self._file.seek(0, os.SEEK_END)

    def append(self, decision: Decision) -> None:
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow([spreadsheet_safe(cell) for cell in decision])
        self._write(out.getvalue())

    def _write(self, text: str) -> None:
        self._file.write(text.encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def default_path(root: str, pipeline_name: str) -> str:
    """Where `imagepipe review` keeps decisions unless told: under --root, never inside the user's data."""
    return os.path.join(root, "review", f"{pipeline_name}.csv")
