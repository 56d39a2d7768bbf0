"""What every layout's listing is made of: a Candidate (a file, its label and split, or the problem that keeps it out)
and the Listing; walking a folder, reading a manifest's rows, the label sets of multi-label data. sources.py and
automl_import.py list the layouts from these."""

import hashlib
import os
import posixpath
import stat
import unicodedata
from dataclasses import dataclass, field
from typing import Iterator, List, NamedTuple, Optional, Tuple

from images.image_check import Reason
from storage.errors import DataError
from storage.files import is_remote, local_or_supported, read_bytes, remote_files

SPLIT_ORDER = ("train", "eval", "test")
LABEL_SEPARATOR = ";"  # between the labels of a multi-label manifest cell, and in a label set's string


def label_set(names) -> str:
    """A multi-label candidate's labels as one string: NFC names, each once, sorted, joined by LABEL_SEPARATOR."""
    return LABEL_SEPARATOR.join(sorted({normalize_label(n) for n in names if n and n.strip()}))


def labels_of(label: Optional[str]) -> List[str]:
    """The names in a label set's string (label_set); [] for none."""
    return [n for n in (label or "").split(LABEL_SEPARATOR) if n]


def resolve_task(task: str, multi_found: bool) -> str:
    """single or multi for a source: `task` (--task) when given, else multi where the source says so."""
    if task == "auto":
        return "multi" if multi_found else "single"
    return task


# Folder names and manifest values accepted for each split.
SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "eval": "eval",
    "evaluation": "eval",
    "validation": "eval",
    "valid": "eval",
    "val": "eval",
    "test": "test",
    "testing": "test",
}


# Files that operating systems and tools drop into folders; never images, never counted.
_SYSTEM_FILES = {"thumbs.db", "desktop.ini", "icon\r"}


def split_sort_key(name: str) -> Tuple[int, str]:
    """train, eval, test first, then any other split name alphabetically."""
    return (SPLIT_ORDER.index(name) if name in SPLIT_ORDER else len(SPLIT_ORDER), name)


class Candidate(NamedTuple):
    """One input file (or manifest row) to ingest."""

    uri: str  # what to open
    rel_path: str  # relative to the data root, '/'-separated: becomes image/filename
    label: Optional[str]  # the class; multi-label: the label set (label_set), "" when none applies
    split: Optional[str]  # pre-assigned split, or None to split by content hash
    size: int = -1  # bytes, from the listing (-1 when unknown)
    mtime_ns: int = 0
    problem: Optional[Tuple[str, str]] = None  # (reason, detail) known before reading


@dataclass
class Listing:
    layout: str
    source: str
    candidates: List[Candidate] = field(default_factory=list)
    skipped_hidden: int = 0  # dotfiles and OS clutter (.DS_Store, Thumbs.db), not counted as seen
    task: str = "single"  # or "multi": each candidate's label is a label set (label_set)

    @property
    def classes(self) -> List[str]:
        """The class names (multi-label: the label names) of the usable candidates, sorted."""
        if self.task == "multi":
            return sorted({n for c in self.candidates if not c.problem for n in labels_of(c.label)})
        return sorted({c.label for c in self.candidates if c.label and not c.problem})

    def fingerprint(self) -> str:
        """Changes when any file is added, removed, renamed, relabelled or rewritten."""
        digest = hashlib.sha256(self.task.encode() if self.task != "single" else b"")
        for c in self.candidates:
            digest.update(
                f"{c.rel_path}\0{c.label}\0{c.split}\0{c.size}\0{c.mtime_ns}\n".encode("utf-8", "surrogateescape")
            )
        return f"layout:{self.layout},files:{len(self.candidates)},sha256:{digest.hexdigest()}"


def read_manifest(path: str) -> str:
    """A CSV manifest's text; DataError unless it is a regular file (a named pipe would block forever,
    a device never end) of UTF-8 text. A NUL character is refused here, as Python 3.10's csv module refused it (3.11 and
    later read it into a cell: a binary file would pass as a manifest of odd paths)."""
    if not is_remote(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            raise DataError(f"{path}: cannot read the manifest ({e.strerror}); check the path") from None
        if not stat.S_ISREG(mode):
            raise DataError(
                f"{path}: not a regular file (a named pipe, device or folder), so it is not read; "
                "give a CSV manifest file"
            )
    try:
        text = read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; save the manifest as UTF-8 CSV") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise DataError(f"{path}: not a readable CSV (line {line} contains NUL); save it as plain UTF-8 CSV")
    return text


OUTSIDE_ROOT_PROBLEM = "symbolic link leading outside the data root (not read)"


def walk(root: str, boundary: Optional[str] = None) -> Iterator[Tuple[str, int, int, Optional[str]]]:
    """Yields (relative path with '/', size, mtime_ns, problem) for every file under root, sorted.

    `problem` is set for entries that cannot be read as files: a broken symbolic
    link, a FIFO or device (opening a FIFO would block forever), a folder that
    cannot be listed, or a symbolic link (to a file, or from a folder) that leads
    outside `boundary` (default root): /etc/passwd linked into a class folder is
    never read. Symbolic links to folders are followed, except a link back to one
    of its own ancestors (a loop, which would list the same files forever).
    """
    if is_remote(root):
        yield from ((rel, size, mtime, None) for rel, size, mtime in sorted(remote_files(root)))
        return
    unlistable: List[Tuple[str, str]] = []
    ancestors = {}  # folder path -> (device, inode) of it and every folder above it
    boundary = boundary or root

    def relative(path: str) -> str:
        rel = os.path.relpath(path, root)
        return "" if rel == "." else rel.replace(os.sep, "/")

    for dirpath, dirnames, filenames in os.walk(
        root, followlinks=True, onerror=lambda e: unlistable.append((e.filename, e.strerror))
    ):
        st = os.stat(dirpath)
        above = ancestors.get(os.path.dirname(dirpath), frozenset()) if dirpath != root else frozenset()
        if (st.st_dev, st.st_ino) in above:
            dirnames[:] = []  # a loop: this folder is one of its own ancestors
            continue
        ancestors[dirpath] = above | {(st.st_dev, st.st_ino)}
        dirnames.sort()
        rel_dir = relative(dirpath)
        folder_inside = _real_inside(dirpath, boundary)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = posixpath.join(rel_dir, name) if rel_dir else name
            if not folder_inside or (os.path.islink(full) and not _real_inside(full, boundary)):
                yield rel, -1, 0, OUTSIDE_ROOT_PROBLEM
                continue
            try:
                st = os.stat(full)
            except OSError as e:
                problem = "broken symbolic link" if os.path.islink(full) else f"cannot stat: {e.strerror}"
                yield rel, -1, 0, problem
                continue
            problem = None if stat.S_ISREG(st.st_mode) else "not a regular file (a pipe, socket or device)"
            yield rel, st.st_size, st.st_mtime_ns, problem
    for path, error in unlistable:
        # Whatever is inside cannot be counted: the folder itself is the quarantined entry.
        yield relative(path) + "/", -1, 0, f"folder cannot be listed: {error}"


def is_hidden(rel_path: str) -> bool:
    parts = rel_path.split("/")
    return (
        any(p.startswith(".") for p in parts) or parts[-1].lower() in _SYSTEM_FILES or parts[-1].startswith("__MACOSX")
    )


def display(rel_path: str) -> str:
    """File names may hold bytes that are not UTF-8; keep them readable."""
    return rel_path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def normalize_label(label: str) -> str:
    # macOS writes file names in NFD: 'é' must be the same class on every machine.
    return unicodedata.normalize("NFC", label.strip())


def relative_to_root(data_root: str, path: str) -> str:
    if is_remote(data_root):
        rel = path[len(data_root.rstrip("/")) + 1 :] if path.startswith(data_root.rstrip("/") + "/") else path
    else:
        rel = os.path.relpath(path, data_root).replace(os.sep, "/")
    return rel


def manifest_row(root: str, base: str, raw_path: str, where: str) -> Tuple[str, Optional[Tuple[str, str]]]:
    """(the file a manifest row names, (Reason.OUTSIDE_ROOT, detail) or None): a row may name only files
    below `root` (../../secret.txt, /etc/passwd or a link leading out are never read). `base` is the
    manifest's folder, which relative rows start from."""
    uri = _resolve_manifest_path(base, raw_path)
    try:
        local_or_supported(uri, f"{where}: {raw_path!r}")
    except DataError as e:  # s3://, http://: nothing here reads them
        return uri, (Reason.UNREADABLE, str(e))
    inside = uri == root or uri.startswith(root + ("/" if is_remote(root) else os.sep))
    if not inside:
        return uri, (Reason.OUTSIDE_ROOT, f"{where}: {raw_path!r} resolves outside the data root {root}")
    if not is_remote(uri) and os.path.islink(uri) and not _real_inside(uri, root):
        return uri, (Reason.OUTSIDE_ROOT, f"{where}: {raw_path!r} is a {OUTSIDE_ROOT_PROBLEM}")
    return uri, None


def _resolve_manifest_path(base: str, raw_path: str) -> str:
    if is_remote(raw_path):
        try:
            return local_or_supported(raw_path, raw_path)  # file:// rows are local files
        except DataError:
            return raw_path  # another scheme: no filesystem reads it (an unsupported_scheme row)
    if is_remote(base):
        return posixpath.normpath(posixpath.join(base, raw_path)).replace(":/", "://", 1)
    return os.path.normpath(os.path.join(base, raw_path))


def _real_inside(path: str, root: str) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def row_candidate(uri: str, rel_path: str, label, split, problem, where: str, multi: bool) -> Candidate:
    """A manifest's or an import file's row as a Candidate: its file stat'ed unless the row already has a problem
    (an unreadable one becomes the problem); a single-label row's empty label is None."""
    size, mtime = -1, 0
    if uri and problem is None:
        size, mtime, unreadable = stat_file(uri)
        problem = (Reason.UNREADABLE, f"{where}: {unreadable}") if unreadable else None
    return Candidate(
        uri=uri,
        rel_path=display(rel_path),
        label=label if multi else (label or None),
        split=split,
        size=size,
        mtime_ns=mtime,
        problem=problem,
    )


def stat_file(uri: str) -> Tuple[int, int, Optional[str]]:
    """(size, mtime_ns, problem); a missing file is left for the reader to report."""
    if is_remote(uri):
        return -1, 0, None
    try:
        st = os.stat(uri)
    except OSError:
        return -1, 0, None
    if not stat.S_ISREG(st.st_mode):
        return -1, 0, "not a regular file (a folder, pipe or device)"
    return st.st_size, st.st_mtime_ns, None
