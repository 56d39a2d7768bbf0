"""ImageExampleGen's report of a run: the summary (counts per split and class, quarantine reasons,
duplicates), the checks that make a run fail with one line (every file accounted for, the bad-file
limit, two classes, every split and class trained), and the quarantine CSV.

The executor (executor.py) builds these from what its Beam graph returns and writes them to the
component's `report` output; runs/run_summary.py reads them back.
"""

import collections
import json
import os
from typing import Any, Dict, List, NamedTuple

from absl import logging
from tfx.utils import io_utils

from components.example_gen import SUMMARY_FILE
from images.finding.listing import Listing, labels_of
from images.image_check import Reason
from storage.spreadsheet import csv_text
from trainer import class_balance

QUARANTINE_COLUMNS = ("path", "reason", "detail", "label", "split")
NEAR_DUPLICATE_COLUMNS = ("group", "path", "label", "split")


class IngestionError(RuntimeError):
    """The run cannot produce usable examples; one line that says why and what to do."""


class _Tally(NamedTuple):
    """The examples written, counted per split and class, and in all."""

    per_split: Dict[str, Dict[str, int]]
    examples: Dict[str, int]
    without_labels: Dict[str, int]
    label_sets: Dict[str, int]
    formats: Dict[str, int]
    written: int
    downscaled: int


def _tally(counts: Dict[tuple, int], split_names: List[str], multi: bool) -> _Tally:
    """Sums the counts per (split, label, format, copy) the ways the summary shows them."""
    per_split: Dict[str, Dict[str, int]] = {s: {} for s in split_names}  # multi-label: images per label
    examples: Dict[str, int] = {s: 0 for s in split_names}
    without_labels: Dict[str, int] = {s: 0 for s in split_names}  # multi-label: images no label applies to
    label_sets: Dict[str, int] = collections.Counter()  # multi-label: images per set of labels, in train
    formats: Dict[str, int] = collections.Counter()
    written = downscaled = 0
    for (split, label, fmt, is_copy), n in sorted(counts.items()):
        if n == 0:
            continue
        classes = per_split.setdefault(split, {})
        for name in labels_of(label) if multi else [label]:
            classes[name] = classes.get(name, 0) + n
        examples[split] = examples.get(split, 0) + n
        if multi and not label:
            without_labels[split] = without_labels.get(split, 0) + n
        if multi and split == "train":
            label_sets[label] += n
        formats[fmt] += n
        written += n
        downscaled += n if is_copy else 0
    return _Tally(per_split, examples, without_labels, label_sets, formats, written, downscaled)


def build_summary(
    listing: Listing,
    counts: Dict[tuple, int],
    bad: List[Dict[str, str]],
    label_map: Dict[str, int],
    split_names: List[str],
    duplicates: List[List[str]],
) -> Dict[str, Any]:
    """Everything a person or a test wants to know about the run, as plain JSON."""
    multi = listing.task == "multi"
    tally = _tally(counts, split_names, multi)
    per_split = tally.per_split
    reasons = collections.Counter(row["reason"] for row in bad)
    return {
        "source": listing.source,
        "layout": listing.layout,
        "task": listing.task,  # single- or multi-label (sources.py)
        "files_seen": len(listing.candidates),
        "examples_written": tally.written,
        "downscaled": tally.downscaled,  # examples holding a copy within store_max_pixels
        "quarantined": len(bad),
        "skipped_hidden": listing.skipped_hidden,
        # Files quarantined on request (copies dropped with --drop-duplicates or --near-duplicates drop, images a
        # review excluded) are not bad files.
        "bad_fraction": round((len(bad) - quarantined_on_request(reasons)) / max(1, len(listing.candidates)), 6),
        "quarantine_reasons": dict(sorted(reasons.items())),
        "examples_per_split": tally.examples,
        "examples_per_split_and_class": per_split,  # multi-label: images per label (an image counts for each)
        # Multi-label: images with no label (negatives for every label), and the most common label sets in train.
        **(_multi_label_summary(tally) if multi else {}),
        # Largest / smallest class in train (trainer/class_balance.py): above 3 training balances the classes.
        "imbalance_ratio": class_balance.imbalance_ratio(per_split.get("train", {})),
        # Classes with too few eval images to judge the model on, none included (the Evaluator does not hold them to
        # --min-class-recall; data health and the model card name them).
        "classes_with_few_eval_examples": sorted(
            label
            for label in label_map
            if any(c.get(label) for c in per_split.values())
            and per_split.get("eval", {}).get(label, 0) < class_balance.MIN_EVAL_EXAMPLES
        ),
        "formats": dict(sorted(tally.formats.items())),
        "label_map": label_map,
        "classes_without_examples": sorted(
            set(label_map) - {label for c in per_split.values() for label, n in c.items() if n}
        ),
        "label_conflicts": reasons.get(Reason.LABEL_CONFLICT, 0),
        # Groups of files with identical bytes (each group in one split, or quarantined).
        "duplicate_groups": len(duplicates),
        "duplicate_files": sum(len(g) for g in duplicates),
        "duplicate_examples": sorted(duplicates)[:20],
    }


def _multi_label_summary(tally: _Tally) -> Dict[str, Any]:
    return {
        "examples_without_labels": tally.without_labels,
        "label_sets_in_train": dict(sorted(tally.label_sets.items(), key=lambda kv: (-kv[1], kv[0]))[:20]),
        "label_cooccurrence_in_train": cooccurrence(tally.label_sets),
    }


def cooccurrence(label_sets: Dict[str, int]) -> Dict[str, Dict[str, int]]:
    """{label: {other label: images with both}} from the images per label set (only pairs that occur)."""
    pairs: Dict[str, Dict[str, int]] = {}
    for label_set, n in label_sets.items():
        names = labels_of(label_set)
        for a in names:
            for b in names:
                if a != b:
                    pairs.setdefault(a, {})[b] = pairs.get(a, {}).get(b, 0) + n
    return {a: dict(sorted(others.items())) for a, others in sorted(pairs.items())}


def quarantined_on_request(reasons: Dict[str, int]) -> int:
    """Files quarantined on request (copies dropped, images a review excluded): not bad files."""
    return (
        reasons.get(Reason.DUPLICATE, 0)
        + reasons.get(Reason.NEAR_DUPLICATE, 0)
        + reasons.get(Reason.EXCLUDED_BY_REVIEW, 0)
    )


def check_summary(summary: Dict[str, Any], max_bad_fraction: float, source: str) -> None:
    """Enforces the accounting invariant and the user's limits; raises IngestionError."""
    seen, written, bad = summary["files_seen"], summary["examples_written"], summary["quarantined"]
    if seen != written + bad:
        raise IngestionError(f"internal error: {seen} files seen but {written} written + {bad} quarantined")
    top = ", ".join(f"{r} {n}" for r, n in sorted(summary["quarantine_reasons"].items(), key=lambda kv: -kv[1]))
    if written == 0:
        raise IngestionError(
            f"{source}: no valid image among {seen} files (quarantined: {top}); "
            "check that the path holds JPEG, PNG, GIF or BMP images"
        )
    if summary["bad_fraction"] > max_bad_fraction:
        bad -= quarantined_on_request(summary["quarantine_reasons"])
        raise IngestionError(
            f"{source}: {bad} of {seen} files ({summary['bad_fraction']:.1%}) were quarantined ({top}), "
            f"over the limit of {max_bad_fraction:.1%}; fix or remove them, or raise --max-bad-fraction"
        )
    with_examples = sorted(set(summary["label_map"]) - set(summary["classes_without_examples"]))
    if len(with_examples) < 2:
        raise IngestionError(
            f"{source}: valid images in only one class ({', '.join(with_examples)}); a classifier needs at least two"
        )
    for split, n in summary["examples_per_split"].items():
        if n == 0:
            raise IngestionError(
                f"{source}: split {split!r} has no valid examples; add images (or a {split}/ folder) "
                "or change the split ratios"
            )
    train = summary["examples_per_split_and_class"].get("train", {})
    untrained = sorted(label for label in with_examples if not train.get(label))
    if untrained and summary.get("task") == "multi":
        # A label on a file or two, all in eval: the model cannot learn it, the other labels it can (a long tail of
        # tags is common): said in the summary; training sets nothing for it (features.label_target).
        summary["split_notes"] = summary.get("split_notes", []) + [
            f"{len(untrained):,} labels only in eval or test, which the model does not learn: "
            + ", ".join(untrained[:5])
            + (f" and {len(untrained) - 5:,} more" if len(untrained) > 5 else "")
        ]
    elif untrained:
        # The model learns its classes from train: these would have no output, and their eval labels no id.
        raise IngestionError(
            f"{source}: classes with no training example: {', '.join(untrained)}; add images of them "
            "(a class needs at least a few to land some in train), or remove them"
        )
    if summary["classes_without_examples"]:
        # The model would silently not know them: the user listed them as classes.
        names = ", ".join(repr(n) for n in summary["classes_without_examples"][:5])
        raise IngestionError(
            f"{source}: classes with no valid image (every file of theirs was quarantined): {names}; fix or "
            "replace their files, or remove the classes"
        )


def quarantine_csv(rows: List[Dict[str, str]]) -> str:
    return csv_text(QUARANTINE_COLUMNS, sorted(rows, key=lambda r: (r["path"], r["reason"])))


def log_summary(summary: Dict[str, Any]) -> None:
    logging.info(
        "ImageExampleGen: %d files seen, %d examples written %s, %d quarantined %s, %d hidden skipped",
        summary["files_seen"],
        summary["examples_written"],
        summary["examples_per_split"],
        summary["quarantined"],
        summary["quarantine_reasons"],
        summary["skipped_hidden"],
    )


def read_report(report_uri: str) -> Dict[str, Any]:
    """The summary a run wrote (for the CLI and tests)."""
    return json.loads(io_utils.read_string_file(os.path.join(report_uri, SUMMARY_FILE)))
