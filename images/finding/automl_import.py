"""Vertex AI AutoML image classification import files, as Vertex documents them, as a data source.

    CSV, no header, one image a row:     [ML_USE,]GCS_FILE_PATH,LABEL
                          multi-label:   [ML_USE,]GCS_FILE_PATH[,LABEL1,LABEL2,...]
    JSON Lines, one image a line:        {"imageGcsUri": "gs://...", "classificationAnnotation":
                                          {"displayName": "daisy"}, "dataItemResourceLabels":
                                          {"aiplatform.googleapis.com/ml_use": "training"}}
                          multi-label:   "classificationAnnotations": [{"displayName": "dog"}, ...]

ML_USE (CSV) or the ml_use resource label (JSON Lines) gives the split: TRAINING -> train, VALIDATION
-> eval, TEST -> test (a third split, scored by the Evaluator and shown apart), UNASSIGNED or none ->
split by content hash like class folders. Several import files: put them in one folder and give the
folder as --data (CSV and JSON Lines may be mixed; the images may sit in its subfolders).

Paths are gs:// URIs, as Vertex writes them, or local paths (relative to the import file's folder). As
for manifests, a row names only files it may: a local path below the import file's folder, a gs:// object
in the import file's own bucket (a gs:// import file) or any gs:// object (a local import file); other
rows are error rows, never read. An import is multi-label (--task auto) when a row names several labels or a
line has classificationAnnotations (AutoML's multi-label kind); then a row without labels is an image no label
applies to. With --task single, a row with several labels stops the run with one line. A line that is not JSON, or a CSV row without a path or
with an ML_USE Vertex does not know, is an error row; the run goes on and accounts for it.
"""

import csv
import io
import json
import os
import posixpath
from typing import List, NamedTuple, Optional, Tuple

from images.finding.listing import (
    LABEL_SEPARATOR,
    Candidate,
    Listing,
    is_hidden,
    label_set,
    manifest_row,
    normalize_label,
    read_manifest,
    relative_to_root,
    resolve_task,
    row_candidate,
)
from images.image_check import Reason
from storage.errors import DataError
from storage.files import is_dir, is_remote, join, remote_top_files

ML_USE = {"training": "train", "train": "train", "validation": "eval", "test": "test", "unassigned": None}
ML_USE_LABEL = "aiplatform.googleapis.com/ml_use"
SUFFIXES = (".csv", ".jsonl")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ico")


def looks_like_import_csv(text: str) -> bool:
    """Whether a CSV's first row is an AutoML import row ([ML_USE,]PATH,LABEL) rather than a path,label header."""
    for row in csv.reader(io.StringIO(text[:4096])):
        cells = [c.strip() for c in row]
        if not any(cells):
            continue
        if cells[0].lower() in ML_USE:
            return True
        return cells[0].lower() not in ("path", "label", "split") and (
            is_remote(cells[0]) or cells[0].lower().endswith(IMAGE_SUFFIXES)
        )
    return False


def import_files(source: str) -> List[str]:
    """The import file, or a folder's import files (sorted): a folder whose top-level files are all .csv
    and .jsonl import files (the images may be in its subfolders); [] for any other folder."""
    if not is_dir(source):
        return [source]
    if is_remote(source):  # the top level only, as locally (a recursive listing of millions of objects is minutes)
        top = sorted(rel for rel in remote_top_files(source) if not is_hidden(rel))
    else:  # only the top level: no walk of a large class-folder tree to rule this layout out
        top = sorted(e.name for e in os.scandir(source) if e.is_file() and not is_hidden(e.name))
    if not top or not all(rel.lower().endswith(SUFFIXES) for rel in top):
        return []
    files = [join(source, rel) for rel in sorted(top)]
    if not all(path.lower().endswith(".jsonl") or looks_like_import_csv(read_manifest(path)) for path in files):
        return []  # a path,label manifest beside class folders, say
    return files


def list_import(data_root: str, source: str, task: str = "auto") -> Listing:
    listing = Listing(layout="automl", source=source)
    files = import_files(source)
    if not files:
        raise DataError(f"{source}: not an AutoML import file or a folder of them (.csv, .jsonl)")
    rows = []
    for path in files:
        text = read_manifest(path)
        rows += [
            (path, row)
            for row in (_jsonl_rows(path, text) if path.lower().endswith(".jsonl") else _csv_rows(path, text))
        ]
    listing.task = resolve_task(task, any(len(row.labels) > 1 or row.multi_kind for _, row in rows))
    for path, row in rows:
        if len(row.labels) > 1 and listing.task == "single":
            raise DataError(
                f"{path} line {row.where.rsplit(' ', 1)[-1]}: {len(row.labels)} "
                f"labels ({', '.join(map(repr, row.labels[:3]))}): a multi-label row with --task single; "
                "give each image one label, or train a multi-label model with --task multi (or auto)"
            )
        bad = next((n for n in row.labels if LABEL_SEPARATOR in n), None) if listing.task == "multi" else None
        if bad is not None:
            raise DataError(
                f"{path} line {row.where.rsplit(' ', 1)[-1]}: label {bad!r} holds "
                f"{LABEL_SEPARATOR!r}, which separates a multi-label image's labels; rename the label"
            )
        listing.candidates.append(_candidate(data_root, path, row, listing.task == "multi"))
    if not listing.candidates:
        raise DataError(f"{source}: the import file has no rows; add one row per image")
    return listing


class Row(NamedTuple):
    where: str  # "<file> line N"
    path: str
    labels: Tuple[str, ...]
    ml_use: Optional[str]
    error: str = ""  # a line that could not be read
    multi_kind: bool = False  # a JSON Lines item with classificationAnnotations (AutoML's multi-label import)


def _csv_rows(path: str, text: str):
    name = posixpath.basename(path)
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise DataError(f"{path}: not a readable CSV ({e}); save it as plain UTF-8 CSV") from None
    for line_no, row in enumerate(rows, start=1):
        cells = [c.strip() for c in row]
        while cells and not cells[-1]:
            cells.pop()  # trailing empty fields, as spreadsheets write them
        if not cells:
            continue
        where = f"{name} line {line_no}"
        ml_use = None
        if cells[0].lower() in ML_USE or (len(cells) == 3 and not _is_path(cells[0])):
            ml_use, cells = cells[0], cells[1:]
        yield Row(where, cells[0] if cells else "", tuple(c for c in cells[1:] if c), ml_use)


def _jsonl_rows(path: str, text: str):
    name = posixpath.basename(path)
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {line_no}"
        try:
            item = json.loads(line)
        except ValueError:
            yield Row(where, "", (), None, "not JSON")
            continue
        if not isinstance(item, dict):
            yield Row(where, "", (), None, "not a JSON object")
            continue
        annotations = item.get("classificationAnnotations") or []
        if isinstance(item.get("classificationAnnotation"), dict):
            annotations = [item["classificationAnnotation"], *annotations]
        labels = [a.get("displayName", "") for a in annotations if isinstance(a, dict)]
        if not all(isinstance(label, str) for label in labels):
            yield Row(where, "", (), None, "classificationAnnotation.displayName is not text")
            continue
        labels_of_item = item.get("dataItemResourceLabels") or {}
        ml_use = labels_of_item.get(ML_USE_LABEL) if isinstance(labels_of_item, dict) else None
        yield Row(
            where,
            str(item.get("imageGcsUri") or ""),
            tuple(n for n in labels if n),
            ml_use if isinstance(ml_use, str) else None,
            multi_kind="classificationAnnotations" in item,
        )


def _is_path(text: str) -> bool:
    return is_remote(text) or "/" in text or text.lower().endswith(IMAGE_SUFFIXES)


def _candidate(data_root: str, import_file: str, row: Row, multi: bool = False) -> Candidate:
    """The row's file; multi: its label is the row's label set (label_set), "" when none applies."""
    where, raw_path, ml_use = row.where, row.path, row.ml_use
    label = label_set(row.labels) if multi else (row.labels[0] if row.labels else "")
    if row.error:
        return Candidate(
            uri="", rel_path=f"<{where}>", label=None, split=None, problem=(Reason.UNREADABLE, f"{where}: {row.error}")
        )
    split = None
    problem = None
    if ml_use:
        if ml_use.lower() not in ML_USE:
            problem = (
                Reason.UNKNOWN_SPLIT,
                f"{where}: ML_USE {ml_use!r} is not TRAINING, VALIDATION, TEST or UNASSIGNED",
            )
        else:
            split = ML_USE[ml_use.lower()]
    label = normalize_label(label) if label and not multi else label
    if not raw_path:
        return Candidate(
            uri="",
            rel_path=f"<{where}>",
            label=label if multi else (label or None),
            split=split,
            problem=problem or (Reason.MISSING_FILE, f"{where} has no image path"),
        )
    base = posixpath.dirname(import_file) if is_remote(import_file) else os.path.dirname(os.path.abspath(import_file))
    if is_remote(raw_path) and not is_remote(import_file):
        uri = raw_path  # a local import file of Cloud Storage images: the user points it there
    else:
        root = (
            _bucket(import_file)
            if is_remote(raw_path)
            else (data_root.rstrip("/") if is_remote(data_root) else os.path.abspath(data_root))
        )
        uri, outside = manifest_row(root, base, raw_path, where)
        problem = problem or outside
    if not label and problem is None and not multi:
        problem = (Reason.MISSING_LABEL, f"{where} has no label")
    rel = (
        uri if is_remote(uri) and not uri.startswith(data_root.rstrip("/") + "/") else relative_to_root(data_root, uri)
    )
    return row_candidate(uri, rel, label, split, problem, where, multi)


def _bucket(uri: str) -> str:
    """gs://bucket of a gs:// path."""
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"
