"""Turns a data source into the list of files to ingest, each with its label and split.

Four layouts, detected from the source itself (or forced with `layout=`):
  folders   <root>/<class>/.../<image>              (split by content hash)
  presplit  <root>/<split>/<class>/.../<image>      (split from the folder name)
  manifest  a CSV file with a `path,label[,split]` header; paths relative to the CSV (`path,labels[,split]`:
            multi-label, labels separated by ';', an empty cell when none applies)
  automl    Vertex AI AutoML import files (CSV [ML_USE,]PATH,LABEL without a header, or JSON Lines),
            one or a folder of them (automl_import.py)

Multi-label listings (Listing.task "multi") give each candidate its label set as one string, the names sorted and
joined by LABEL_SEPARATOR ("" when no label applies: such an image is a negative for every label, not a row
without a label); labels_of() splits it.

Only listing happens here: no file is opened except the CSV. Problems that are
known from the listing alone (a manifest row whose file escapes the data root, a
file outside any class folder) become candidates with a `problem`, so that every
file is accounted for. Problems that make the whole source unusable raise
DataError with a one-line message that names the path and the fix.
"""

import collections
import csv
import hashlib
import io
import os
import posixpath
import stat
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from components.image_example_gen.image_check import Reason
from storage.errors import DataError
from components.image_example_gen.ingest_defaults import LAYOUTS
from storage.files import exists, is_dir, is_remote, join, local_or_supported, read_bytes, remote_files

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
    "train": "train", "training": "train",
    "eval": "eval", "evaluation": "eval", "validation": "eval", "valid": "eval", "val": "eval",
    "test": "test", "testing": "test",
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
            digest.update(f"{c.rel_path}\0{c.label}\0{c.split}\0{c.size}\0{c.mtime_ns}\n"
                          .encode("utf-8", "surrogateescape"))
        return f"layout:{self.layout},files:{len(self.candidates)},sha256:{digest.hexdigest()}"


# File system access (local paths with os, gs:// with Beam's FileSystems) is storage/files.py's.


def read_manifest(path: str) -> str:
    """A CSV manifest's text; DataError unless it is a regular file (a named pipe would block forever,
    a device never end) of UTF-8 text."""
    if not is_remote(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            raise DataError(f"{path}: cannot read the manifest ({e.strerror}); check the path") from None
        if not stat.S_ISREG(mode):
            raise DataError(f"{path}: not a regular file (a named pipe, device or folder), so it is not read; "
                            "give a CSV manifest file")
    try:
        return read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; save the manifest as UTF-8 CSV") from None


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

    for dirpath, dirnames, filenames in os.walk(root, followlinks=True,
                                                onerror=lambda e: unlistable.append((e.filename, e.strerror))):
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
    return (any(p.startswith(".") for p in parts)
            or parts[-1].lower() in _SYSTEM_FILES or parts[-1].startswith("__MACOSX"))


def _display(rel_path: str) -> str:
    """File names may hold bytes that are not UTF-8; keep them readable."""
    return rel_path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def normalize_label(label: str) -> str:
    # macOS writes file names in NFD: 'é' must be the same class on every machine.
    return unicodedata.normalize("NFC", label.strip())


# ---------------------------------------------------------------------------


def detect_layout(source: str) -> str:
    """'automl' for AutoML import files (a .jsonl, a .csv of [ML_USE,]PATH,LABEL rows, or a folder of them),
    'manifest' for another .csv, 'presplit' when the top folders are split names, else 'folders'."""
    from components.image_example_gen import automl_import

    if not is_dir(source):
        if source.lower().endswith(".jsonl"):
            return "automl"
        if source.lower().endswith(".csv"):
            return "automl" if automl_import.looks_like_import_csv(read_manifest(source)) else "manifest"
        raise DataError(
            f"{source}: not a folder, a .csv manifest or an AutoML import file (.csv, .jsonl); point it at a "
            "folder of class subfolders (<data>/<class>/<image>), a CSV with a path,label[,split] header, or a "
            "Vertex AI AutoML import file")
    if automl_import.import_files(source):
        return "automl"
    top = {rel.split("/", 1)[0] for rel, _, _, _ in walk(source)
           if "/" in rel and not is_hidden(rel)}
    if top and all(t.lower() in SPLIT_ALIASES for t in top) and any(
            SPLIT_ALIASES[t.lower()] == "train" for t in top):
        return "presplit"
    return "folders"


def list_source(data_root: str, source: str, layout: str = "auto",
                split: Optional[str] = None, task: str = "auto") -> Listing:
    """Lists every file of one source.

    Args:
      data_root: the pipeline's input base; image/filename is relative to it and
        manifest rows may not point outside it.
      source: a folder or a CSV file under data_root (a resolved input pattern).
      layout: one of LAYOUTS.
      split: when the input config names this source's split, every file gets it.
      task: auto, single or multi (ingest_defaults.TASKS).
    """
    if layout not in LAYOUTS:
        raise DataError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if not exists(source):
        raise DataError(f"{source}: no such file or folder; check the --data path")
    if layout == "auto":
        layout = detect_layout(source)
    if layout == "manifest":
        listing = _list_manifest(data_root, source, task)
    elif layout == "automl":
        from components.image_example_gen import automl_import

        listing = automl_import.list_import(data_root, source, task)
    else:
        if task == "multi":
            raise DataError(f"{source}: class folders give each image one label, so --task multi cannot read them; "
                            "list the images in a path,labels manifest (labels separated by ';') or an AutoML "
                            "multi-label import file")
        listing = _list_tree(data_root, source, presplit=(layout == "presplit"))
    if split is not None:
        listing.candidates = [
            c._replace(split=c.split or split) for c in listing.candidates]
    if not listing.candidates:
        raise DataError(
            f"{source}: no image files found; expected images in class subfolders "
            "(<data>/<class>/<image>, optionally <data>/train/<class>/...) or a CSV manifest")
    return listing


def _relative_to_root(data_root: str, path: str) -> str:
    if is_remote(data_root):
        rel = path[len(data_root.rstrip("/")) + 1:] if path.startswith(data_root.rstrip("/") + "/") else path
    else:
        rel = os.path.relpath(path, data_root).replace(os.sep, "/")
    return rel


def _list_tree(data_root: str, source: str, presplit: bool) -> Listing:
    listing = Listing(layout="presplit" if presplit else "folders", source=source)
    prefix = _relative_to_root(data_root, source)
    prefix = "" if prefix in (".", "") else prefix + "/"
    folders = {}  # class name -> the folder names that give it
    for rel, size, mtime, unreadable in walk(source, boundary=data_root):
        if is_hidden(rel):
            listing.skipped_hidden += 1
            continue
        parts = rel.split("/")
        split = None
        problem = ((Reason.OUTSIDE_ROOT if unreadable == OUTSIDE_ROOT_PROBLEM else Reason.UNREADABLE), unreadable) \
            if unreadable else None
        if presplit:
            split = SPLIT_ALIASES.get(parts[0].lower())
            if split is None and problem is None:
                problem = (Reason.UNKNOWN_SPLIT,
                           f"top folder {parts[0]!r} is not a split name ({', '.join(sorted(set(SPLIT_ALIASES)))})")
            parts = parts[1:]
        label = normalize_label(_display(parts[0])) if len(parts) >= 2 else None
        if label:  # one folder name per class; NFC and NFD spellings of a name are one (see normalize_label)
            name = parts[0]
            folders.setdefault(label, set()).add(name if _display(name) != name else unicodedata.normalize("NFC", name))
        if problem is None and not label:
            problem = (Reason.MISSING_LABEL, "file is not inside a class folder")
        listing.candidates.append(Candidate(
            uri=join(source, *rel.split("/")), rel_path=_display(prefix + rel), label=label,
            split=split, size=size, mtime_ns=mtime, problem=problem))
    _check_distinct_classes(folders, source)
    return listing


def _check_distinct_classes(folders, source: str) -> None:
    """DataError when two class folders would become one class: names that differ only by spaces at
    either end, or by bytes that are not UTF-8 (both shown as U+FFFD)."""
    for label, names in sorted(folders.items()):
        if len(names) > 1:
            shown = " and ".join(repr(_display(n)) for n in sorted(names)[:3])
            raise DataError(f"{source}: class folders {shown} would become one class {label!r} (their names "
                            "differ only by spaces or undecodable bytes); rename or merge them")


def _list_manifest(data_root: str, manifest: str, task: str = "auto") -> Listing:
    listing = Listing(layout="manifest", source=manifest)
    text = read_manifest(manifest)
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise DataError(f"{manifest}: not a readable CSV ({e}); save it as plain UTF-8 CSV") from None
    header = [h.strip().lower() for h in rows[0]] if rows else []
    if "path" not in header or ("label" not in header and "labels" not in header):
        got = ",".join(rows[0])[:60] if rows else "an empty file"
        raise DataError(
            f"{manifest}: the first line must be a header naming the columns path,label[,split] (or path,labels"
            f"[,split] for several labels an image) (got {got!r}); add that header line (an AutoML import file, "
            "[ML_USE,]PATH,LABEL, is read with --layout automl)")
    if "label" in header and "labels" in header:
        raise DataError(f"{manifest}: the header names both label and labels; keep one column (labels for several "
                        f"labels an image, separated by {LABEL_SEPARATOR!r})")
    listing.task = resolve_task(task, "labels" in header)
    multi = listing.task == "multi"
    if "labels" in header and not multi:
        raise DataError(f"{manifest}: a labels column (several labels an image) with --task single; name the column "
                        "label for one class an image, or use --task multi (or auto)")
    col_path, col_label = header.index("path"), header.index("labels" if "labels" in header else "label")
    col_split = header.index("split") if "split" in header else None
    base = posixpath.dirname(manifest) if is_remote(manifest) else os.path.dirname(os.path.abspath(manifest))
    root = data_root.rstrip("/") if is_remote(data_root) else os.path.abspath(data_root)
    for line_no, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # blank line
        cell = lambda i: row[i].strip() if i is not None and i < len(row) else ""  # noqa: E731
        raw_path, split_value = cell(col_path), cell(col_split)
        label = label_set(cell(col_label).split(LABEL_SEPARATOR)) if multi else normalize_label(cell(col_label))
        where = f"{posixpath.basename(manifest)} line {line_no}"
        problem = None
        if not raw_path:
            uri, rel = "", f"<{where}>"
            problem = (Reason.MISSING_FILE, f"{where} has no path")
        else:
            uri, problem = manifest_row(root, base, raw_path, where)
            rel = raw_path if problem else _relative_to_root(root, uri)
        split = None
        if split_value:
            split = SPLIT_ALIASES.get(split_value.lower())
            if split is None and problem is None:
                problem = (Reason.UNKNOWN_SPLIT,
                           f"{where}: split {split_value!r} is not one of train, eval, test")
        if not label and problem is None and not multi:  # multi-label: an empty cell means no label applies
            problem = (Reason.MISSING_LABEL, f"{where} has an empty label")
        size, mtime = -1, 0
        if uri and problem is None:
            size, mtime, unreadable = _stat(uri)
            problem = (Reason.UNREADABLE, f"{where}: {unreadable}") if unreadable else None
        listing.candidates.append(Candidate(
            uri=uri, rel_path=_display(rel), label=label if multi else (label or None), split=split,
            size=size, mtime_ns=mtime, problem=problem))
    if not listing.candidates:
        raise DataError(f"{manifest}: the manifest has a header but no rows; add one row per image")
    return listing


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


def _stat(uri: str) -> Tuple[int, int, Optional[str]]:
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



def label_key(name: str) -> str:
    """What a person reads in a label: compatibility-normalised (NFKC), case-folded, without invisible characters
    (zero-width spaces and joiners, soft hyphens, byte-order marks: Unicode's format characters) and with runs of
    white space as one space."""
    visible = "".join(ch for ch in unicodedata.normalize("NFKC", name) if unicodedata.category(ch) != "Cf")
    return " ".join(visible.casefold().split())


def _check_distinct_labels(classes: List[str], source: str) -> None:
    """DataError when two labels read the same to a person ('dog', 'Dog', 'dog' + U+200B): they would train as
    separate classes, each with part of the images, and no report shows why. Every source of labels (class
    folders, manifests, AutoML import files) comes through here."""
    seen: Dict[str, str] = {}
    for name in classes:
        first = seen.setdefault(label_key(name), name)
        if first != name:
            raise DataError(f"{source}: labels {printable_label(first)} and {printable_label(name)} differ only by case, "
                            "Unicode form or invisible characters, and would train as two classes; use one spelling "
                            "(rename the folder or fix the labels), or names that differ otherwise if they are two")


def printable_label(name: str) -> str:
    """A label as repr() shows it, with invisible characters spelled out (repr leaves U+200B as it is)."""
    return "'" + "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cf", "Cc", "Zl", "Zp") else ch
                         for ch in name).replace("'", "\\'") + "'"


def check_usable(listing: Listing) -> None:
    """Fails fast, before any decoding, on a source that cannot train a classifier."""
    classes = listing.classes
    for name in classes:
        control = next((ch for ch in name if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
        if control is not None:
            # A newline in a class name drops out of TFT's vocabulary file (one class per line), and
            # its examples get label -1; other control characters break terminals and tools.
            raise DataError(f"{listing.source}: class name {name!r} contains the control character {control!r}; "
                            "rename that class folder (or manifest label) to printable characters")
    _check_distinct_labels(classes, listing.source)
    troubled = [c for c in listing.candidates if c.problem]
    if not classes and troubled:  # every labelled row is quarantined before any file is read: say why
        reasons = collections.Counter(c.problem[0] for c in troubled)
        reason, count = reasons.most_common(1)[0]
        example = next(c for c in troubled if c.problem[0] == reason).problem[1]
        if reason != Reason.MISSING_LABEL:  # (no label at all: the layout advice below says more)
            raise DataError(f"{listing.source}: none of the {len(listing.candidates):,} files or rows is usable; the "
                            f"most common reason is {reason} ({count:,}), e.g. {example}")
    if not classes:
        raise DataError(
            f"{listing.source}: no file has a label; put images in class subfolders "
            "(<data>/<class>/<image>) or give a label column in the manifest")
    if len(classes) < 2:
        raise DataError(
            f"{listing.source}: found only one class ({classes[0]!r}); a classifier needs at least "
            "two, so add a folder (or manifest label) per class")
    if listing.layout == "automl":
        usable = [c for c in listing.candidates if not c.problem]
        for needed, ml_use in (("train", "TRAINING"), ("eval", "VALIDATION")):
            if not any(c.split in (needed, None) for c in usable):
                raise DataError(f"{listing.source}: no {ml_use} or UNASSIGNED rows, so no {needed} split; mark some "
                                f"rows {ml_use}, or leave ML_USE out to split by hash")
    if listing.layout == "presplit":
        splits = {c.split for c in listing.candidates if c.split}
        for needed in ("train", "eval"):
            if needed not in splits:
                raise DataError(
                    f"{listing.source}: the pre-split data has no {needed}/ folder (found "
                    f"{', '.join(sorted(splits))}); add one (eval may be named validation or val), or use "
                    "plain class folders to split by hash")
