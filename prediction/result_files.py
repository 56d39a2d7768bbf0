"""What `imagepipe predict` writes: result records (JSON Lines, CSV, Vertex AutoML's batch prediction
shape), the results file (whole or not at all), the progress line, and names made safe for a terminal."""

import csv
import hashlib
import io as bytes_io
import json
import os
import time
import unicodedata
from typing import Dict, List, Optional

import numpy as np

from components.evaluator.views import given_a_class
from images.finding.listing import LABEL_SEPARATOR
from prediction.image_inputs import InputError
from storage import user_files
from storage.errors import ConfigError
from storage.spreadsheet import csv_text, spreadsheet_safe
from trainer import explain


def printable(text: str) -> str:
    """Text for a terminal: control and format characters (escape sequences, bidi overrides) escaped."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C" else ch for ch in text
    )


def json_record(result: Dict, top: int = 0) -> str:
    """A result as one JSONL line (no newline): path, then predictions [{class, probability}] (the first `top`;
    0: all) and unsure (the best is at or below the model's confidence threshold), or error."""
    record = {"path": result["path"]}
    if "error" in result:
        record["error"] = result["error"]
    else:
        record["predictions"] = [
            {"class": name, "probability": round(p, 6)} for name, p in result["predictions"][: top or None]
        ]
        if "labels" in result:  # a multi-label model: every label above its threshold
            record["labels"] = [{"label": name, "probability": round(p, 6)} for name, p in result["labels"]]
        record["unsure"] = bool(result.get("unsure"))
    return json.dumps(record, ensure_ascii=False)


MIME_TYPES = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".gif": "image/gif",
    ".bmp": "image/bmp",
    ".webp": "image/webp",
}


def automl_record(result: Dict, threshold) -> str:
    """A result in Vertex AutoML's batch prediction shape (one JSONL line): instance {content, mimeType} and
    prediction {ids, displayNames, confidences}, the classes above the confidence threshold, best first
    (none when the model is unsure; a multi-label model: every label above its own threshold, as AutoML's
    multi-label output lists them); an input that failed has error {message} instead."""
    record: Dict = {
        "instance": {
            "content": result["path"],
            "mimeType": MIME_TYPES.get(os.path.splitext(result["path"])[1].lower(), "application/octet-stream"),
        }
    }
    if "error" in result:
        record["error"] = {"message": result["error"]}
    elif "labels" in result:
        kept = [(j, name, p) for j, (name, p) in zip(result["label_ids"], result["labels"])]
    else:
        kept = [
            (j, name, p) for j, (name, p) in zip(result["ids"], result["predictions"]) if given_a_class(p, threshold)
        ]
    if "error" not in result:
        record["prediction"] = {
            "ids": [str(j) for j, _, _ in kept],
            "displayNames": [n for _, n, _ in kept],
            "confidences": [round(p, 6) for _, _, p in kept],
        }
    return json.dumps(record, ensure_ascii=False)


def csv_header(top: int, multi_label: bool = False) -> List[str]:
    """The results CSV's columns; a multi-label model's add `labels`: every label above its threshold, ';'-joined."""
    return [
        "path",
        *[f"{name}_{rank}" for rank in range(1, top + 1) for name in ("class", "probability")],
        *(["labels"] if multi_label else []),
        "unsure",
        "error",
    ]


def csv_cells(result: Dict, top: int, multi_label: bool = False) -> List[str]:
    """A result as a CSV row under csv_header(top, multi_label): empty class/probability cells where there are fewer."""
    cells = [value for name, p in result.get("predictions", [])[:top] for value in (name, f"{p:.6f}")]
    unsure = "" if "error" in result else ("yes" if result.get("unsure") else "no")
    # the labels over their thresholds, most probable first
    labels = [LABEL_SEPARATOR.join(name for name, _ in result.get("labels", []))] if multi_label else []
    row = [result["path"], *cells, *[""] * (2 * top - len(cells)), *labels, unsure, result.get("error", "")]
    return [spreadsheet_safe(cell) for cell in row]  # names are the user's (or an attacker's): never formulas


def _first_line(head: bytes) -> str:
    return head.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _json_keys(head: bytes) -> set:
    try:
        record = json.loads(_first_line(head))
    except ValueError:
        return set()
    return set(record) if isinstance(record, dict) else set()


def _our_results(head: bytes) -> bool:
    """A results file predict wrote: empty (no input), a CSV under csv_header, or JSON Lines of json_record."""
    line = _first_line(head)
    return (
        not line
        or (line.startswith("path,") and line.endswith(",unsure,error"))
        or ("path" in _json_keys(head) and bool({"predictions", "error"} & _json_keys(head)))
    )


def _our_automl_records(head: bytes) -> bool:
    keys = _json_keys(head)
    return not _first_line(head) or ("instance" in keys and bool({"prediction", "error"} & keys))


RESULTS = user_files.Kind("a results file", _our_results)
AUTOML_RESULTS = user_files.Kind("an AutoML results file", _our_automl_records)


def check_outputs(outputs: Dict[str, str], inputs: List[str], model_dir: Optional[str]) -> None:
    """InputError for a results file that would overwrite an input (a manifest, an import file), a file predict did
    not write, or the other results file, or that lies inside the model's folder; before any image is read."""
    given = [(option, path) for option, path in outputs.items() if path]
    local_inputs = [item for item in inputs if not item.startswith("gs://") and os.path.exists(item)]
    for option, path in given:
        if path.startswith("gs://"):
            continue  # Dataflow's outputs: its own checks (batch_predict.check_dataflow)
        if os.path.exists(path) and any(user_files.same_file(path, item) for item in local_inputs):
            raise InputError(f"{option} {path}: it is one of the inputs; give another file for the results")
        if (
            model_dir
            and not model_dir.startswith("gs://")
            and os.path.isdir(model_dir)
            and user_files.inside(path, model_dir)
        ):
            raise InputError(f"{option} {path}: inside the model's folder {model_dir}; write the results elsewhere")
        try:
            user_files.check_target(path, option, AUTOML_RESULTS if option == "--automl-output" else RESULTS)
        except ConfigError as e:
            raise InputError(str(e)) from None
    if len(given) == 2 and os.path.abspath(given[0][1]) == os.path.abspath(given[1][1]):
        raise InputError(f"--output and --automl-output {given[0][1]}: one file cannot hold both; give two")


def check_explain_folder(folder: str, inputs: List[str], outputs: List[str], model_dir: Optional[str]) -> None:
    """InputError for an --explain folder that is, holds or lies inside an input, a results file or the model's
    folder: the maps go to a folder of their own."""
    # A results file counts whether or not it exists yet: one written inside the folder would go with it.
    local = [
        p
        for p in [*inputs, *([model_dir] if model_dir else [])]
        if p and not p.startswith("gs://") and os.path.exists(p)
    ]
    local += [p for p in outputs if p and not p.startswith("gs://")]
    if folder.startswith("gs://"):
        raise InputError(f"--explain {folder}: give a local folder (the maps are moved into place whole)")
    for path in local:
        if user_files.inside(folder, path) or user_files.inside(path, folder):
            raise InputError(
                f"--explain {folder}: it is, holds or lies inside {path} (an input, a results file or the "
                "model); give a folder of its own for the maps"
            )


def output_kind(path: str, option: str = "--output") -> str:
    """'.jsonl' or '.csv' from a results file's name; else InputError (--automl-output: .jsonl only)."""
    kind = os.path.splitext(path)[1].lower()
    if option == "--automl-output" and kind != ".jsonl":
        raise InputError(f"--automl-output {path}: name a .jsonl file (AutoML's batch prediction output is JSON Lines)")
    if kind not in (".jsonl", ".csv"):
        raise InputError(f"{option} {path}: name a .jsonl or .csv file")
    return kind


class PredictionProgress:
    """How far a long prediction run is, on one stderr line: rewritten in place on a terminal, else a
    new line every `every` seconds (logs). Nothing for runs shorter than `every`."""

    def __init__(self, stream, total: Optional[int] = None, every: float = 30.0):
        self._stream, self._total, self._every = stream, total, every
        self._tty = stream.isatty()
        self._start = self._last = time.monotonic()
        self._shown = False

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < (0.5 if self._tty else self._every):
            return
        if final and not self._shown:
            return
        self._last, self._shown = now, True
        rate = done / max(now - self._start, 1e-9)
        of = f"/{self._total:,} ({100 * done // max(self._total, 1)}%)" if self._total else ""
        line = f"{done:,}{of} inputs done, {rate:,.0f}/s"
        self._stream.write(("\r" + line + ("\n" if final else "")) if self._tty else line + "\n")
        self._stream.flush()


class ResultWriter:
    """Writes results to a .jsonl or .csv file as they come; the file has its name only once complete.
    A write that fails (a full disk) is one InputError naming its option, and leaves no partial file."""

    def __init__(self, path: str, top: int, automl_threshold=None, multi_label: bool = False):
        """automl_threshold set: AutoML's batch prediction shape (automl_record) at that threshold (a multi-label
        model's: per label). multi_label: the CSV has a labels column."""
        self._option = "--output" if automl_threshold is None else "--automl-output"
        kind = output_kind(path, self._option)
        self._automl = automl_threshold
        self.path, self._partial = path, None
        try:
            self._partial = user_files.partial_path(path)
            self._file = open(self._partial, "w", newline="", encoding="utf-8")
        except OSError as e:
            user_files.discard(self._partial)
            raise InputError(f"{self._option} {path}: cannot write there ({e.strerror or e})") from None
        self._csv = csv.writer(self._file) if kind == ".csv" else None
        self._top, self._closed, self._multi_label = top, False, multi_label
        if self._csv:
            self._guarded(self._csv.writerow, csv_header(top, multi_label))

    def write(self, result: Dict) -> None:
        if self._automl is not None:
            self._guarded(self._file.write, automl_record(result, self._automl) + "\n")
        elif self._csv:
            self._guarded(self._csv.writerow, csv_cells(result, self._top, self._multi_label))
        else:
            self._guarded(self._file.write, json_record(result, self._top) + "\n")

    def close(self, complete: bool) -> None:
        """Moves the file into place (complete), or removes it; once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.close()  # flushes: a full disk shows here
            if complete:
                os.replace(self._partial, self.path)
                return
        except OSError as e:
            user_files.discard(self._partial)
            if complete:
                raise self._error(e) from None
            return
        user_files.discard(self._partial)  # never a partial result file under the final name

    def _guarded(self, write, *args) -> None:
        try:
            write(*args)
        except OSError as e:
            self.close(complete=False)
            raise self._error(e) from None

    def _error(self, e: OSError) -> "InputError":
        return InputError(
            f"{self._option} {self.path}: cannot write the results ({e.strerror or e}); free space there "
            "or give a path on a disk with room"
        )


EXPLANATIONS_INDEX = "index.csv"
EXPLANATIONS_KIND = "imagepipe predict --explain"  # the folder's marker: only such a folder is ever replaced
EXPLANATION_COLUMNS = ("path", "class", "probability", "overlay", "attribution")


def safe_stem(path: str, most: int = 60) -> str:
    """A file name's stem with only letters, digits, '.', '-' and '_' (others '_'): input names may hold anything."""
    stem = os.path.splitext(path.rstrip("/").rsplit("/", 1)[-1])[0]
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in stem)[:most] or "image"


class ExplanationWriter:
    """`imagepipe predict --explain DIR`: for each classified image, NNNNN-<name>.png (the map over the image, as
    the model saw it) and NNNNN-<name>.npy (the map: float32 [size, size], summing to 1), numbered in input order
    (names never collide, whatever the inputs are called), and index.csv (path, class, probability, overlay,
    attribution). Written into a temporary folder beside DIR and moved into place whole once every input is done;
    DIR must be new, empty, or one written here before (replaced)."""

    def __init__(self, out: str, option: str = "--explain", overlay_size: int = 256):
        try:
            self._folder = user_files.FolderWriter(out, option, EXPLANATIONS_KIND)
        except ConfigError as e:
            raise InputError(str(e)) from None
        self.path, self._option, self._size = out, option, overlay_size
        self._rows: List[Dict[str, str]] = []

    def write(self, result: Dict) -> None:
        if "attribution" not in result:
            return
        try:
            write_explanation(
                self._folder.partial, result, f"{len(self._rows) + 1:05d}-{safe_stem(result['path'])}", self._size
            )
        except OSError as e:
            self.close(complete=False)
            raise InputError(
                f"{self._option} {self.path}: cannot write the explanations ({e.strerror or e}); free "
                "space there or give a folder on a disk with room"
            ) from None
        name, probability = result["predictions"][0]
        self._rows.append(
            {
                "path": result["path"],
                "class": name,
                "probability": f"{probability:.6f}",
                "overlay": result["overlay"],
                "attribution": result["attribution_file"],
            }
        )

    def close(self, complete: bool) -> None:
        if complete:
            try:
                with open(os.path.join(self._folder.partial, EXPLANATIONS_INDEX), "w", encoding="utf-8") as f:
                    f.write(csv_text(EXPLANATION_COLUMNS, self._rows))
            except OSError as e:
                self._folder.close(complete=False)
                raise InputError(
                    f"{self._option} {self.path}: cannot write the explanations ({e.strerror or e}); "
                    "free space there or give a folder on a disk with room"
                ) from None
        try:
            self._folder.close(complete)
        except ConfigError as e:
            raise InputError(str(e)) from None


def write_explanation(folder: str, result: Dict, stem: Optional[str] = None, overlay_size: int = 256) -> None:
    """A result's map (predict.explained) as folder/<stem>.png (over the image) and <stem>.npy; the result then
    names them ('overlay', 'attribution_file') instead of holding the arrays. The default stem, for Beam's workers
    (which know no input order): a hash of the path, then its safe name."""
    if "attribution" not in result:
        return

    stem = (
        stem
        or f"{hashlib.sha1(result['path'].encode('utf-8', 'surrogateescape')).hexdigest()[:12]}-"
        f"{safe_stem(result['path'])}"
    )
    pixels, attribution = result.pop("pixels"), result.pop("attribution")
    saved = bytes_io.BytesIO()
    np.save(saved, attribution)
    with open(os.path.join(folder, stem + ".npy"), "wb") as f:
        f.write(saved.getvalue())
    with open(os.path.join(folder, stem + ".png"), "wb") as f:
        f.write(explain.overlay_png(pixels, attribution, max(overlay_size, pixels.shape[0])))
    result.update(overlay=stem + ".png", attribution_file=stem + ".npy")
