"""What a run lists for review, most useful first: an image once, with every reason it is listed.

Order: likely label errors (DataHealth's confident-learning rank: the most likely first), near-duplicate groups
whose copies disagree on the label or straddle train and eval, misclassified eval images (the first ones the
Evaluator recorded), outliers and poor images, then, given `imagepipe predict`'s output, the predictions it was
unsure of. Each item: its image (a file under the run's data root, or a predicted file as predict listed it), the
label it was given, what the model or the check suggests and how sure, why it is listed.
"""

import csv
import json
import os
from typing import Any, Dict, List, Optional

from components.evaluator import misclassified as eval_misclassified
from components.evaluator.results import INDEX_FILE
from components.example_gen import NEAR_DUPLICATES_FILE
from components.health import LABEL_ISSUES_FILE, OUTLIERS_FILE
from storage import files as fs
from storage import user_files
from storage.errors import ConfigError
from storage.spreadsheet import read_rows

LABEL_SUSPECT, CONFLICT, MISCLASSIFIED, OUTLIER, UNSURE = (
    "label suspect",
    "near-duplicate conflict",
    "misclassified",
    "outlier",
    "unsure prediction",
)
KINDS = (LABEL_SUSPECT, CONFLICT, MISCLASSIFIED, OUTLIER, UNSURE)
PLURALS = {
    LABEL_SUSPECT: "label suspects",
    CONFLICT: "near-duplicate conflicts",
    MISCLASSIFIED: "misclassified eval images",
    OUTLIER: "outliers",
    UNSURE: "unsure predictions",
}


class Items:
    """Items in order, by path; each a dict: id, path (as shown), file (where the server reads it), key (content
    hash, "" when the run did not record it), split, given, suggested, confidence, kinds, reasons."""

    def __init__(self, data_root: str):
        self.data_root = data_root
        self.items: List[Dict[str, Any]] = []
        self._by_path: Dict[str, Dict[str, Any]] = {}

    def add(self, kind: str, path: str, reason: str, file: str = "", **fields) -> None:
        item = self._by_path.get(path)
        if item is None:
            item = {
                "id": len(self.items),
                "path": path,
                "file": file or self._file(path),
                "key": "",
                "split": "",
                "given": "",
                "suggested": "",
                "confidence": None,
                "kinds": [],
                "reasons": [],
            }
            self.items.append(item)
            self._by_path[path] = item
        for name, value in fields.items():
            if value not in ("", None) and item.get(name) in ("", None):
                item[name] = value
        if kind not in item["kinds"]:
            item["kinds"].append(kind)
        item["reasons"].append(reason)

    def _file(self, path: str) -> str:
        """Where a listed path is read: under the data root; an AutoML import file's image elsewhere on Cloud
        Storage is listed by its whole URI."""
        return path if fs.is_remote(path) else fs.join(self.data_root, path)


def from_run(summary: Dict[str, Any], predictions: Optional[str] = None) -> Items:
    """The items of a run (run_summary.summarize's output) and of a predictions file."""
    components = {c["component"]: c for c in summary["components"]}
    ingestion = components.get("ImageExampleGen") or {}
    data_root = str((ingestion.get("properties") or {}).get("input_base") or "")
    found = Items(data_root)
    health = _output(components.get("DataHealth"), "health")
    _add_label_suspects(found, health)
    _add_conflicts(found, _output(ingestion, "report"))
    _add_misclassified(found, _output(components.get("Evaluator"), "evaluation"))
    _add_outliers(found, health)
    if predictions:
        _add_unsure(found, predictions)
    return found


def _add_label_suspects(found: Items, health: Optional[str]) -> None:
    """The label check's suspects (DataHealth's label_issues.csv)."""
    for row in _csv(health, LABEL_ISSUES_FILE):
        probability = float(row["given_probability"] or 0)
        found.add(
            LABEL_SUSPECT,
            row["path"],
            f"likely label error: the check suggests {row['suggested']} (the given label's probability "
            f"{probability:.2f})",
            key=row.get("key", ""),
            split=row["split"],
            given=row["given"],
            suggested=row["suggested"],
            confidence=round(1 - probability, 4),
        )


def _add_conflicts(found: Items, report: Optional[str]) -> None:
    """Near-duplicate groups (ingestion's near_duplicates.csv) whose members differ in label or split."""
    groups: Dict[str, List[Dict[str, str]]] = {}
    for row in _csv(report, NEAR_DUPLICATES_FILE):
        groups.setdefault(row["group"], []).append(row)
    for members in groups.values():
        labels, splits = {m["label"] for m in members}, {m["split"] for m in members}
        if len(labels) > 1 or len(splits) > 1:
            why = (
                f"near-duplicates labelled {' / '.join(sorted(labels))}"
                if len(labels) > 1
                else f"near-duplicates in {' and '.join(sorted(splits))}"
            )
            for m in members:
                others = ", ".join(o["path"] for o in members if o is not m)[:300]
                found.add(CONFLICT, m["path"], f"{why}: {others}", split=m["split"], given=m["label"])


def _add_misclassified(found: Items, evaluation: Optional[str]) -> None:
    """The eval images the model got wrong (the Evaluator's misclassified/index.json)."""
    index = _json(evaluation, os.path.join(eval_misclassified.MISCLASSIFIED_DIR, INDEX_FILE)) or {}
    for image in index.get("images", []):
        found.add(
            MISCLASSIFIED,
            image["path"],
            f"misclassified in eval: the model says {image['predicted']} at {image['probability']:.2f}",
            split="eval",
            given=image["actual"],
            suggested=image["predicted"],
            confidence=image["probability"],
        )


def _add_outliers(found: Items, health: Optional[str]) -> None:
    """DataHealth's outliers.csv."""
    for row in _csv(health, OUTLIERS_FILE):
        found.add(
            OUTLIER,
            row["path"],
            f"outlier: {row['reasons']}",
            key=row.get("key", ""),
            split=row["split"],
            given=row["label"],
        )


def _add_unsure(found: Items, predictions: str) -> None:
    """The unsure results of a predictions file."""
    for record in _predictions(predictions):
        best = (record.get("predictions") or [{}])[0]
        found.add(
            UNSURE,
            record["path"],
            f"unsure prediction: best {best.get('class')} at {best.get('probability', 0):.2f}",
            file=record["path"],
            suggested=best.get("class", ""),
            confidence=best.get("probability"),
        )


def _output(component: Optional[Dict[str, Any]], name: str) -> Optional[str]:
    if not component or component.get("missing"):
        return None
    uris = (component.get("outputs") or {}).get(name) or []
    return uris[0] if uris else None


def _csv(folder: Optional[str], name: str) -> List[Dict[str, str]]:
    if not folder or not fs.exists(fs.join(folder, name)):
        return []
    return read_rows(fs.read_bytes(fs.join(folder, name)).decode("utf-8"))


def _json(folder: Optional[str], name: str) -> Optional[Dict[str, Any]]:
    if not folder or not fs.exists(fs.join(folder, name)):
        return None
    return json.loads(fs.read_bytes(fs.join(folder, name)))


PREDICTIONS_GIVE = "give the file `imagepipe predict --output` wrote (.jsonl or .csv)"


def _predictions(path: str) -> List[Dict[str, Any]]:
    """The unsure records of `imagepipe predict --output` (JSON Lines or CSV); a file that is not one is refused in
    one line (ConfigError)."""
    if not fs.is_remote(path):
        user_files.check_source(path, "--predictions", PREDICTIONS_GIVE)
    elif not fs.exists(path):
        raise ConfigError(f"--predictions {path}: no such file; {PREDICTIONS_GIVE}")
    try:
        return _unsure_records(path, fs.read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, RecursionError, csv.Error) as e:
        raise ConfigError(
            f"--predictions {path}: not a predictions file ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}); "
            + PREDICTIONS_GIVE
        ) from None


def _unsure_records(path: str, text: str) -> List[Dict[str, Any]]:
    if path.endswith(".csv"):
        rows = read_rows(text)
        return [
            {
                "path": r["path"],
                "predictions": [{"class": r.get("class_1", ""), "probability": float(r.get("probability_1") or 0)}],
            }
            for r in rows
            if r.get("unsure") == "yes"
        ]  # prediction/result_files.py csv_cells
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in records if r.get("unsure")]
