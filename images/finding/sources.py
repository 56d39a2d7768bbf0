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
without a label); listing.labels_of() splits it.

Only listing happens here: no file is opened except the CSV. Problems that are
known from the listing alone (a manifest row whose file escapes the data root, a
file outside any class folder) become candidates with a `problem`, so that every
file is accounted for. Problems that make the whole source unusable raise
DataError with a one-line message that names the path and the fix.
"""

import collections
import csv
import io
import os
import posixpath
import unicodedata
from typing import Dict, List, Optional

from images.finding import LAYOUTS, automl_import
from images.finding.listing import (
    LABEL_SEPARATOR,
    OUTSIDE_ROOT_PROBLEM,
    SPLIT_ALIASES,
    Candidate,
    Listing,
    display,
    is_hidden,
    label_set,
    labels_of,
    manifest_row,
    normalize_label,
    read_manifest,
    relative_to_root,
    resolve_task,
    row_candidate,
    walk,
)
from images.image_check import Reason
from storage.errors import DataError
from storage.files import exists, is_dir, is_remote, join


def detect_layout(source: str) -> str:
    """'automl' for AutoML import files (a .jsonl, a .csv of [ML_USE,]PATH,LABEL rows, or a folder of them),
    'manifest' for another .csv, 'presplit' when the top folders are split names, else 'folders'."""
    if not is_dir(source):
        if source.lower().endswith(".jsonl"):
            return "automl"
        if source.lower().endswith(".csv"):
            return "automl" if automl_import.looks_like_import_csv(read_manifest(source)) else "manifest"
        raise DataError(
            f"{source}: not a folder, a .csv manifest or an AutoML import file (.csv, .jsonl); point it at a "
            "folder of class subfolders (<data>/<class>/<image>), a CSV with a path,label[,split] header, or a "
            "Vertex AI AutoML import file"
        )
    if automl_import.import_files(source):
        return "automl"
    return _tree_layout(walk(source))


def _tree_layout(entries) -> str:
    """'presplit' when the top folders of a tree's files (walk's entries) are split names, else 'folders'."""
    top = {rel.split("/", 1)[0] for rel, _, _, _ in entries if "/" in rel and not is_hidden(rel)}
    if top and all(t.lower() in SPLIT_ALIASES for t in top) and any(SPLIT_ALIASES[t.lower()] == "train" for t in top):
        return "presplit"
    return "folders"


def list_source(
    data_root: str, source: str, layout: str = "auto", split: Optional[str] = None, task: str = "auto"
) -> Listing:
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
    entries = None
    if layout == "auto":
        if not is_dir(source) or automl_import.import_files(source):
            layout = detect_layout(source)
        else:  # a tree: walked once, for its layout and its files (a walk of millions of files is minutes)
            entries = list(walk(source, boundary=data_root))
            layout = _tree_layout(entries)
    if layout == "manifest":
        listing = _list_manifest(data_root, source, task)
    elif layout == "automl":
        listing = automl_import.list_import(data_root, source, task)
    else:
        if task == "multi":
            raise DataError(
                f"{source}: class folders give each image one label, so --task multi cannot read them; "
                "list the images in a path,labels manifest (labels separated by ';') or an AutoML "
                "multi-label import file"
            )
        listing = _list_tree(data_root, source, presplit=(layout == "presplit"), entries=entries)
    if split is not None:
        listing.candidates = [c._replace(split=c.split or split) for c in listing.candidates]
    if not listing.candidates:
        raise DataError(
            f"{source}: no image files found; expected images in class subfolders "
            "(<data>/<class>/<image>, optionally <data>/train/<class>/...) or a CSV manifest"
        )
    return listing


def _list_tree(data_root: str, source: str, presplit: bool, entries=None) -> Listing:
    listing = Listing(layout="presplit" if presplit else "folders", source=source)
    prefix = relative_to_root(data_root, source)
    prefix = "" if prefix in (".", "") else prefix + "/"
    folders = {}  # class name -> the folder names that give it
    for rel, size, mtime, unreadable in entries if entries is not None else walk(source, boundary=data_root):
        if is_hidden(rel):
            listing.skipped_hidden += 1
            continue
        parts = rel.split("/")
        split = None
        problem = (
            ((Reason.OUTSIDE_ROOT if unreadable == OUTSIDE_ROOT_PROBLEM else Reason.UNREADABLE), unreadable)
            if unreadable
            else None
        )
        if presplit:
            split = SPLIT_ALIASES.get(parts[0].lower())
            if split is None and problem is None:
                problem = (
                    Reason.UNKNOWN_SPLIT,
                    f"top folder {parts[0]!r} is not a split name ({', '.join(sorted(set(SPLIT_ALIASES)))})",
                )
            parts = parts[1:]
        label = normalize_label(display(parts[0])) if len(parts) >= 2 else None
        if label:  # one folder name per class; NFC and NFD spellings of a name are one (see normalize_label)
            name = parts[0]
            folders.setdefault(label, set()).add(name if display(name) != name else unicodedata.normalize("NFC", name))
        if problem is None and not label:
            problem = (Reason.MISSING_LABEL, "file is not inside a class folder")
        listing.candidates.append(
            Candidate(
                uri=join(source, *rel.split("/")),
                rel_path=display(prefix + rel),
                label=label,
                split=split,
                size=size,
                mtime_ns=mtime,
                problem=problem,
            )
        )
    _check_distinct_classes(folders, source)
    return listing


def _check_distinct_classes(folders, source: str) -> None:
    """DataError when two class folders would become one class: names that differ only by spaces at
    either end, or by bytes that are not UTF-8 (both shown as U+FFFD)."""
    for label, names in sorted(folders.items()):
        if len(names) > 1:
            shown = " and ".join(repr(display(n)) for n in sorted(names)[:3])
            raise DataError(
                f"{source}: class folders {shown} would become one class {label!r} (their names "
                "differ only by spaces or undecodable bytes); rename or merge them"
            )


def _manifest_rows(manifest: str):
    """The manifest's rows and its header's column names (lower case), or DataError on a header that does not
    name its columns."""
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
            "[ML_USE,]PATH,LABEL, is read with --layout automl)"
        )
    if "label" in header and "labels" in header:
        raise DataError(
            f"{manifest}: the header names both label and labels; keep one column (labels for several "
            f"labels an image, separated by {LABEL_SEPARATOR!r})"
        )
    return rows, header


def _manifest_task(manifest: str, header: List[str], task: str) -> str:
    """--task resolved by the header (a labels column: several labels an image)."""
    resolved = resolve_task(task, "labels" in header)
    if "labels" in header and resolved != "multi":
        raise DataError(
            f"{manifest}: a labels column (several labels an image) with --task single; name the column "
            "label for one class an image, or use --task multi (or auto)"
        )
    return resolved


def _list_manifest(data_root: str, manifest: str, task: str = "auto") -> Listing:
    listing = Listing(layout="manifest", source=manifest)
    rows, header = _manifest_rows(manifest)
    listing.task = _manifest_task(manifest, header, task)
    multi = listing.task == "multi"
    col_path, col_label = header.index("path"), header.index("labels" if "labels" in header else "label")
    col_split = header.index("split") if "split" in header else None
    base = posixpath.dirname(manifest) if is_remote(manifest) else os.path.dirname(os.path.abspath(manifest))
    root = data_root.rstrip("/") if is_remote(data_root) else os.path.abspath(data_root)

    def column(row: List[str], i: Optional[int]) -> str:
        return row[i].strip() if i is not None and i < len(row) else ""

    for line_no, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # blank line
        raw_path, split_value = column(row, col_path), column(row, col_split)
        label = (
            label_set(column(row, col_label).split(LABEL_SEPARATOR))
            if multi
            else normalize_label(column(row, col_label))
        )
        where = f"{posixpath.basename(manifest)} line {line_no}"
        problem = None
        if not raw_path:
            uri, rel = "", f"<{where}>"
            problem = (Reason.MISSING_FILE, f"{where} has no path")
        else:
            uri, problem = manifest_row(root, base, raw_path, where)
            rel = raw_path if problem else relative_to_root(root, uri)
        split = None
        if split_value:
            split = SPLIT_ALIASES.get(split_value.lower())
            if split is None and problem is None:
                problem = (Reason.UNKNOWN_SPLIT, f"{where}: split {split_value!r} is not one of train, eval, test")
        if not label and problem is None and not multi:  # multi-label: an empty cell means no label applies
            problem = (Reason.MISSING_LABEL, f"{where} has an empty label")
        listing.candidates.append(row_candidate(uri, rel, label, split, problem, where, multi))
    if not listing.candidates:
        raise DataError(f"{manifest}: the manifest has a header but no rows; add one row per image")
    return listing


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
            raise DataError(
                f"{source}: labels {printable_label(first)} and {printable_label(name)} differ only by case, "
                "Unicode form or invisible characters, and would train as two classes; use one spelling "
                "(rename the folder or fix the labels), or names that differ otherwise if they are two"
            )


def printable_label(name: str) -> str:
    """A label as repr() shows it, with invisible characters spelled out (repr leaves U+200B as it is)."""
    return (
        "'"
        + "".join(
            f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cf", "Cc", "Zl", "Zp") else ch for ch in name
        ).replace("'", "\\'")
        + "'"
    )


def _check_multi_label(listing: Listing, labels: List[str]) -> None:
    """A multi-label set must have something to learn per label: two labels or more (one label, on some images and
    not others, is a yes/no question: two classes), and train rows for every label (the model learns a label
    from train only)."""
    if len(labels) < 2:
        raise DataError(
            f"{listing.source}: a multi-label set with one label ({labels[0]!r}); that is a yes/no "
            f"question: give it as two classes (a label column of {labels[0]!r} and another value, or "
            "two class folders), or add more labels"
        )
    in_train = {
        n for c in listing.candidates if not c.problem and c.split in (None, "train") for n in labels_of(c.label)
    }
    missing = [n for n in labels if n not in in_train]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (
            f" and {len(missing) - 5:,} more" if len(missing) > 5 else ""
        )
        raise DataError(
            f"{listing.source}: label {shown} only on eval or test rows: the model learns a label from "
            "the train split; give it train rows (or leave the split column empty to split by hash)"
        )


def check_usable(listing: Listing) -> None:
    """Fails fast, before any decoding, on a source that cannot train a classifier."""
    classes = listing.classes
    for name in classes:
        control = next((ch for ch in name if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
        if control is not None:
            # A newline in a class name drops out of TFT's vocabulary file (one class per line), and
            # its examples get label -1; other control characters break terminals and tools.
            raise DataError(
                f"{listing.source}: class name {name!r} contains the control character {control!r}; "
                "rename that class folder (or manifest label) to printable characters"
            )
    _check_distinct_labels(classes, listing.source)
    troubled = [c for c in listing.candidates if c.problem]
    if not classes and troubled:  # every labelled row is quarantined before any file is read: say why
        reasons = collections.Counter(c.problem[0] for c in troubled)
        reason, count = reasons.most_common(1)[0]
        example = next(c for c in troubled if c.problem[0] == reason).problem[1]
        if reason != Reason.MISSING_LABEL:  # (no label at all: the layout advice below says more)
            raise DataError(
                f"{listing.source}: none of the {len(listing.candidates):,} files or rows is usable; the "
                f"most common reason is {reason} ({count:,}), e.g. {example}"
            )
    if not classes:
        raise DataError(
            f"{listing.source}: no file has a label; put images in class subfolders "
            "(<data>/<class>/<image>) or give a label column in the manifest"
        )
    if listing.task == "multi":
        _check_multi_label(listing, classes)
    elif len(classes) < 2:
        raise DataError(
            f"{listing.source}: found only one class ({classes[0]!r}); a classifier needs at least "
            "two, so add a folder (or manifest label) per class"
        )
    if listing.layout == "automl":
        usable = [c for c in listing.candidates if not c.problem]
        for needed, ml_use in (("train", "TRAINING"), ("eval", "VALIDATION")):
            if not any(c.split in (needed, None) for c in usable):
                raise DataError(
                    f"{listing.source}: no {ml_use} or UNASSIGNED rows, so no {needed} split; mark some "
                    f"rows {ml_use}, or leave ML_USE out to split by hash"
                )
    if listing.layout == "presplit":
        splits = {c.split for c in listing.candidates if c.split}
        for needed in ("train", "eval"):
            if needed not in splits:
                raise DataError(
                    f"{listing.source}: the pre-split data has no {needed}/ folder (found "
                    f"{', '.join(sorted(splits))}); add one (eval may be named validation or val), or use "
                    "plain class folders to split by hash"
                )
