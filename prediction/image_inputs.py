"""What `imagepipe predict` reads: the images its arguments name (files, folders, CSV manifests, gs://
paths), read and checked with ingestion's rules, and batched by encoded bytes."""

import csv
import io
import os
import posixpath
import stat
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

from images.finding.listing import OUTSIDE_ROOT_PROBLEM, is_hidden, manifest_row, read_manifest, walk
from images.image_check import BadImage, Reason, check_file_size, check_image, max_file_bytes
from storage import files as fs
from storage.errors import DataError

# Encoded bytes per serving call: a call holds its batch's decoded images too, so a batch of
# full-size photos stays a handful (the pipeline's Beam batches are bounded the same way).
BATCH_BYTES = 20 << 20


class InputError(ValueError):
    """An argument that names no usable input (a manifest without a path column); one line."""


class Input(NamedTuple):
    """An image to classify, as the arguments name it."""

    path: str
    problem: Optional[Tuple[str, str]] = None  # (reason, detail) known before reading: a pipe, a row outside
    size: int = -1  # bytes, from a folder's listing (-1: unknown)


def read_image_file(path: str, max_pixels: int, size: int = -1) -> bytes:
    """The bytes of a regular file no bigger than an image within max_pixels can be; else BadImage.

    Opened without blocking and checked on the open file: a named pipe, a device (/dev/zero) or a
    huge file is refused before anything is read, as ingestion refuses them. A remote object is
    read through Beam's file systems, as ingestion reads gs:// (sources.py), once its size is known:
    `size` when its folder's listing gave it, else looked up.
    """
    if fs.is_remote(path):
        if size < 0:
            size = _remote_size(path)
        check_file_size(size, max_pixels)
        return fs.read_bytes(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadImage(Reason.UNREADABLE, "not a regular file (a folder, pipe or device); not read")
        check_file_size(st.st_size, max_pixels)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(max_file_bytes(max_pixels) + 1)
    finally:
        os.close(fd)


def _remote_size(path: str) -> int:
    # Apache Beam (~2 s): only a gs:// input's size needs its file systems
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([path], limits=[1])[0].metadata_list
    except BeamIOError as e:  # the store cannot be reached: a per-file error, like an unreadable file
        raise OSError(str(e).splitlines()[0][:200]) from None
    if not found or found[0].path != path:
        raise OSError("No such file or directory")
    return found[0].size_in_bytes


def expand_inputs(inputs: List[str]) -> Iterator[Input]:
    """An Input for every image the arguments name, in order.

    A file is itself; a folder (local, or a gs:// prefix that holds objects) is every file below it,
    sorted, with hidden files and OS clutter skipped as ingestion skips them, and pipes or devices
    flagged; a .csv manifest (local or gs://) is the paths of its `path` column, relative to the
    manifest's folder. A path that names nothing is itself too: reading it gives its error row. Cloud
    Storage that cannot be reached at all is an InputError (one line) at the first gs:// argument.
    """
    try:
        yield from _expand(inputs)
    except DataError as e:
        raise InputError(str(e)) from None


def _expand(inputs: List[str]) -> Iterator[Input]:
    for item in inputs:
        if fs.is_dir(item):
            for rel, size, _, problem in walk(item):
                if not is_hidden(rel):
                    reason = Reason.OUTSIDE_ROOT if problem == OUTSIDE_ROOT_PROBLEM else Reason.UNREADABLE
                    yield Input(fs.join(item, rel), (reason, problem) if problem else None, size)
        elif item.lower().endswith(".csv") and fs.exists(item):
            yield from _manifest_paths(item)
        else:
            yield Input(item)


def _manifest_paths(manifest: str) -> Iterator[Input]:
    """The rows' files, relative to the manifest's folder and, as in ingestion, only below it: a row naming
    /etc/passwd or ../../secret.txt is an error row, never read (it printed the file's first bytes)."""
    try:
        text = read_manifest(manifest)
    except DataError as e:
        raise InputError(str(e)) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if "path" not in (reader.fieldnames or []):
        raise InputError(f"{manifest}: a manifest needs a header naming a path column (path[,label,split])")
    folder = posixpath.dirname(manifest) if fs.is_remote(manifest) else os.path.dirname(os.path.abspath(manifest))
    for line_no, row in enumerate(reader, start=2):
        path = (row["path"] or "").strip()
        if path:
            where = f"{posixpath.basename(manifest)} line {line_no}"
            uri, problem = manifest_row(folder, folder, path, where)
            yield Input(uri, problem)


def inspect_input(item: Input, max_pixels: int) -> Dict:
    """{'path', 'data': the file's bytes} for a readable image, else {'path', 'error'}; ingestion's checks."""
    result = {"path": item.path}
    try:
        if item.problem:
            raise BadImage(*item.problem)
        data = read_image_file(item.path, max_pixels, item.size)
        check_image(data, max_pixels)
        result["data"] = data
    except OSError as e:
        result["error"] = f"cannot read: {e.strerror or e}"
    except BadImage as e:
        result["error"] = f"{e.reason}: {e.detail}"
    return result


def byte_batches(items: Iterable, size: Callable = len, max_bytes: int = BATCH_BYTES, max_items: int = 64):
    """Consecutive lists of items, each at most max_items and (unless one item alone) max_bytes."""
    batch, total = [], 0
    for item in items:
        size_of_item = size(item)
        if batch and (total + size_of_item > max_bytes or len(batch) == max_items):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size_of_item
    if batch:
        yield batch
