"""DataHealth's executor: one Beam graph over Transform's examples and the features (passes.py: Beam's local
runner here, Dataflow with --dataflow), then the label check on its sample, then the report.

Memory is bounded whatever the number of images (the scale benchmark measures it: docs/benchmarks.md). Every image
streams through the graph: its poor-image statistics, its distance to the nearest training class (4 bytes an image
combined for the far-out fence), its class. What this process holds is what the graph leaves: the rows of the
flagged images, the images a class, and the label check's sample, at most LABEL_CHECK_SAMPLE images stratified by
class (every class at least MIN_SAMPLED_PER_CLASS, or all its images) and chosen by content hash (bits the split
does not use: train and eval alike), so the same images each run: only their features (~5 kB an image at 1,280
values) or, for the opt-in `cnn` check, their pixels at most 32 px a side. On sets of up to LABEL_CHECK_SAMPLE
images every image is checked; above, health.json says how many were, and the share of suspects is estimated class
by class.
"""

import dataclasses
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow_transform as tft
from absl import logging
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components import beam_settings
from components.beam_dependencies import NoTfxPackageForLocalRunners
from components.example_gen import SUMMARY_FILE as INGESTION_SUMMARY
from components.health import (
    HEALTH_FILE,
    LABEL_ISSUES_FILE,
    OUTLIERS_FILE,
    TRUSTED_ACCURACY,
    Limits,
    checks,
    label_issues,
    passes,
)
from components.health.sample import LABEL_CHECK_SAMPLE, MIN_SAMPLED_PER_CLASS, Sample  # noqa: F401 (the bounds)
from images.finding.listing import label_set
from storage.relocation import pipeline_root_of, relocate
from storage.spreadsheet import csv_text
from trainer import features as feature_names
from trainer.artifact_files import FEATURE_PROFILE_FILE, FEATURES_SOURCE_FILE, KERAS_DIR
from trainer.hparams import HParams

SHOWN = 50  # suspects and outliers kept in health.json (all of them are in the CSV files)
_SPLITS = ("train", "eval")


@dataclasses.dataclass
class Examples:
    """The label check's sample (its images' keys, paths, splits, labels: class ids, or multi-label each image's
    list of label ids; and their features by key, or pixels), and the images of every class (multi-label: {None:
    all of them})."""

    keys: List[str] = dataclasses.field(default_factory=list)
    paths: List[str] = dataclasses.field(default_factory=list)
    splits: List[str] = dataclasses.field(default_factory=list)
    labels: List[Any] = dataclasses.field(default_factory=list)
    pixels: List[np.ndarray] = dataclasses.field(default_factory=list)
    vectors: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    per_class: Dict[Any, int] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.per_class.values())


def _inputs(transformed: types.Artifact, features: Optional[types.Artifact]):
    """(split -> file pattern of the examples, the features' description for passes.build or None): splits with
    files only."""
    if features is None:
        return _split_patterns(transformed), None
    source = json.loads(io_utils.read_string_file(os.path.join(features.uri, FEATURES_SOURCE_FILE)))
    return _split_patterns(transformed), {
        "dim": source["dim"],
        "views": source["views"],
        "files": _split_patterns(features),
    }


def _split_patterns(artifact: types.Artifact) -> Dict[str, str]:
    """split -> the file pattern of its records, for the splits that have files."""
    patterns = {}
    for split in _SPLITS:
        uri = artifact_utils.get_split_uri([artifact], split)
        if fileio.glob(os.path.join(uri, "*")):
            patterns[split] = io_utils.all_files_pattern(uri)
    return patterns


def _examples(found: Dict[str, Any]) -> Examples:
    """The sample in a fixed order (train then eval, by path: Beam's order is not), with its vectors."""
    ordered = sorted(found["sample"], key=lambda r: (_SPLITS.index(r[2]), r[1], r[0]))
    examples = Examples(per_class=found["counts"])
    for key, path, split, labels, pixels in ordered:
        examples.keys.append(key)
        examples.paths.append(path)
        examples.splits.append(split)
        examples.labels.append(labels)
        if pixels is not None:
            examples.pixels.append(pixels)
    examples.vectors = found["vectors"]
    return examples


def _class_names(transform_graph: types.Artifact) -> Tuple[List[str], bool]:
    """(the class names in id order, whether the examples are multi-label)."""
    output = tft.TFTransformOutput(transform_graph.uri)
    return (
        [n.decode() for n in output.vocabulary_by_name(feature_names.LABEL_VOCABULARY)],
        feature_names.is_multi_label(output.transformed_feature_spec()),
    )


class Executor(NoTfxPackageForLocalRunners, base_beam_executor.BaseBeamExecutor):
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        started = time.monotonic()
        hp = HParams.from_custom_config(json.loads(exec_properties["hparams"]))
        report = artifact_utils.get_single_instance(input_dict["ingestion_report"])
        transformed = artifact_utils.get_single_instance(input_dict["transformed_examples"])
        features = (input_dict.get("features") or [None])[0]
        baseline = (input_dict.get("baseline_model") or [None])[0]
        health = artifact_utils.get_single_instance(output_dict["health"])
        mode = exec_properties.get("label_check") or "auto"
        check_labels = mode == "on" or (mode == "auto" and features is not None)
        names, multi_label = _class_names(input_dict["transform_graph"][0])
        ingestion = json.loads(io_utils.read_string_file(os.path.join(report.uri, INGESTION_SUMMARY)))
        sample = Sample(_class_counts(ingestion, names, multi_label), multi_label)
        examples, outlier_rows = self._passes(
            transformed,
            features,
            hp,
            names,
            sample,
            keep_pixels=check_labels and features is None,
            keep_vectors=check_labels,
            multi_label=multi_label,
        )
        result: Dict[str, Any] = {
            "examples": examples.total,
            "label_check": mode,
            **({"task": "multi"} if multi_label else {}),
        }

        # Near-duplicates: found at ingestion; their share of eval is gated here with the rest (None: not searched,
        # --near-duplicates off).
        near = ingestion.get("near_duplicate_eval_leak_fraction", 0.0)
        near = None if near is None else float(near)
        result["near_duplicate_eval_leak_fraction"] = near

        issue_rows = _check_labels(examples, names, features, hp, result, check_labels, multi_label)

        result["outliers"] = len(outlier_rows)
        result["outlier_examples"] = outlier_rows[:SHOWN]

        drift = _feature_drift(features, baseline, health.uri, result)
        found, warnings, limits = _problems(result, near, drift, ingestion, exec_properties)
        result.update(
            problems=found,
            warnings=warnings,
            limits=dataclasses.asdict(limits),
            seconds=round(time.monotonic() - started, 2),
        )

        _write(health, result, issue_rows, outlier_rows)
        _log_health(result, outlier_rows, near, drift, found, warnings)

    def _passes(
        self,
        transformed,
        features,
        hp,
        names: List[str],
        sample: Sample,
        keep_pixels: bool,
        keep_vectors: bool,
        multi_label: bool,
    ) -> Tuple[Examples, List[Dict[str, str]]]:
        """The Beam graph's run: (the label check's sample, outliers.csv's rows in a fixed order)."""
        beam_settings.configure_beam()  # fast TFRecord checksums
        examples, feature_source = _inputs(transformed, features)
        if multi_label and not keep_vectors:
            feature_source = None  # multi-label: the features serve the label check only
        if not keep_vectors and not keep_pixels:
            sample = Sample.nothing()  # no label check: no sample gathered
        out_dir = os.path.join(self._get_tmp_dir(), "data_health")
        try:
            with self._make_beam_pipeline() as pipeline:
                gathering = passes.Gathering(hp, names, sample, keep_pixels, multi_label)
                passes.build(pipeline, examples, feature_source, gathering, out_dir)
            found = passes.read(out_dir)
        finally:
            if fileio.exists(out_dir):
                fileio.rmtree(out_dir)
        rows = sorted(found["rows"], key=lambda r: (_SPLITS.index(r["split"]), r["path"], r["key"]))
        return _examples(found), rows


def _check_labels(
    examples: Examples, names: List[str], features, hp, result: Dict[str, Any], check_labels: bool, multi_label: bool
) -> List[Dict[str, str]]:
    """The label check on the sample (when asked): its suspects' rows, and its figures in `result`."""
    if not check_labels:
        issue_rows = []
    else:
        vectors = (
            np.stack([examples.vectors[key] for key in examples.keys])
            if features is not None and examples.keys
            else None
        )
        issue_rows = (_multi_label_issues if multi_label else _single_label_issues)(
            examples, names, vectors, hp, result
        )
    result["label_issues"] = len(issue_rows)
    result["label_issue_fraction"] = (
        _issue_fraction(examples, issue_rows, multi_label) if "label_check_method" in result else None
    )  # None: not checked
    result["label_issue_examples"] = issue_rows[:SHOWN]
    if check_labels and len(examples.keys) < examples.total:
        result["label_check_sampled"] = len(examples.keys)  # of result["examples"]
    return issue_rows


def _problems(
    result: Dict[str, Any], near: Optional[float], drift: Optional[float], ingestion: Dict[str, Any], exec_properties
):
    """(the problems DataHealthGate acts on, the class mix's warnings, the limits they were judged by)."""
    limits = Limits(**{f.name: float(exec_properties[f.name]) for f in dataclasses.fields(Limits)})
    # A weak check's share of suspects (a model that is often wrong suspects many) stops nothing: the
    # summary and the report say that its ranking is unreliable.
    trusted = result.get("label_check_accuracy", 1.0) >= TRUSTED_ACCURACY
    found = checks.problems(near, result["label_issue_fraction"] if trusted else None, drift, limits)
    # The class mix: warned about, never stopping the run (the Evaluator judges every class it can).
    warnings = checks.class_warnings(ingestion.get("examples_per_split_and_class") or {})
    return found, warnings, limits


def _log_health(result: Dict[str, Any], outlier_rows, near: Optional[float], drift, found, warnings) -> None:
    logging.info(
        "DataHealth: %d label issues, %d outliers, near-duplicate eval share %s, feature drift %s",
        result["label_issues"],
        len(outlier_rows),
        "not searched" if near is None else f"{near:.3f}",
        drift,
    )
    if found:  # DataHealthGate stops the run on them (or warns), after these files are kept
        logging.warning("DataHealth: %s", checks.describe(found))
    for warning in warnings:
        logging.warning("DataHealth: %s", warning["text"])


def _class_counts(ingestion: Dict[str, Any], names: List[str], multi_label: bool) -> Dict[Any, int]:
    """Images per class id in train and eval (multi-label: {None: images}), from ingestion's summary: the label
    check's sample is chosen before anything is read."""
    if multi_label:
        return {
            None: sum(
                n for split, n in (ingestion.get("examples_per_split") or {}).items() if split in ("train", "eval")
            )
        }
    ids = {name: i for i, name in enumerate(names)}
    counts: Dict[Any, int] = {}
    for split in ("train", "eval"):
        for name, n in ((ingestion.get("examples_per_split_and_class") or {}).get(split) or {}).items():
            counts[ids.get(name, -1)] = counts.get(ids.get(name, -1), 0) + n
    return counts


def _issue_fraction(examples: Examples, issue_rows: List[Dict[str, str]], multi_label: bool) -> float:
    """The share of images that look mislabelled: of all of them when every image was checked; else estimated
    from the sample, class by class (each class's share of suspects in its sample, weighed by its images)."""
    total = examples.total
    if len(examples.keys) == total or multi_label:
        return round(len(issue_rows) / max(1, len(examples.keys)), 6)
    sampled_per_class: Dict[int, int] = {}
    for label in examples.labels:
        sampled_per_class[label] = sampled_per_class.get(label, 0) + 1
    suspects: Dict[int, int] = {}
    index = {key: i for i, key in enumerate(examples.keys)}
    for row in issue_rows:
        label = examples.labels[index[row["key"]]]
        suspects[label] = suspects.get(label, 0) + 1
    estimate = sum(n / sampled_per_class[c] * examples.per_class.get(c, 0) for c, n in suspects.items()) / total
    return round(estimate, 6)


def _single_label_issues(
    examples: Examples, names: List[str], vectors: Optional[np.ndarray], hp, result: Dict[str, Any]
) -> List[Dict[str, str]]:
    """The label check on the sample (label_issues.rank, confident learning on out-of-sample probabilities): its
    rows for label_issues.csv, and its method, the accuracy of its model or why it was skipped, into `result`."""
    chosen = range(len(examples.keys))
    labels = np.asarray(examples.labels, np.int64)
    ids, contiguous = np.unique(labels, return_inverse=True)
    folds, why = label_issues.folds_for(
        contiguous, label_issues.FOLDS if vectors is not None else label_issues.CNN_FOLDS
    )
    if not folds:
        result["label_check_skipped"] = why
        return []
    probabilities = label_issues.out_of_sample(
        contiguous, vectors, np.stack(examples.pixels) if vectors is None else None, hp, folds
    )
    suspects = [
        s._replace(given=int(ids[s.given]), suggested=int(ids[s.suggested]))
        for s in label_issues.rank(contiguous, probabilities)
    ]
    result["label_check_method"] = (
        f"{folds}-fold logistic regression on backbone features"
        if vectors is not None
        else f"{folds}-fold cnn on pixels"
    )
    # How good the check's model is: confident learning ranks well only when it is good.
    result["label_check_accuracy"] = round(float((probabilities.argmax(axis=1) == contiguous).mean()), 4)
    return [
        {
            "rank": str(n),
            "path": examples.paths[chosen[s.index]],
            "split": examples.splits[chosen[s.index]],
            "given": names[s.given],
            "suggested": names[s.suggested],
            "given_probability": f"{s.given_probability:.4f}",
            "key": examples.keys[chosen[s.index]],
        }
        for n, s in enumerate(suspects, start=1)
    ]


def _feature_drift(features, baseline, health_uri: str, result: Dict[str, Any]) -> Optional[float]:
    """The standardised shift of the backbone features from the last blessed model's (None: not measured)."""
    if features is None or baseline is None:
        return None
    current = _read_json(os.path.join(features.uri, FEATURE_PROFILE_FILE))
    model_dir = relocate(baseline.uri, pipeline_root_of(health_uri))
    drift = checks.feature_drift(_read_json(os.path.join(model_dir, KERAS_DIR, FEATURE_PROFILE_FILE)), current)
    result["feature_drift"] = None if drift is None else round(drift, 4)
    if drift is None:
        result["feature_drift_skipped"] = "the last blessed model keeps no profile of its features"
    return drift


def _write(health, result: Dict[str, Any], issue_rows: List[Dict[str, str]], outlier_rows: List[Dict[str, str]]):
    io_utils.write_string_file(os.path.join(health.uri, HEALTH_FILE), json.dumps(result, indent=1))
    io_utils.write_string_file(
        os.path.join(health.uri, LABEL_ISSUES_FILE),
        csv_text(("rank", "path", "split", "given", "suggested", "given_probability", "key"), issue_rows),
    )
    io_utils.write_string_file(
        os.path.join(health.uri, OUTLIERS_FILE), csv_text(("path", "split", "label", "reasons", "key"), outlier_rows)
    )
    for key in ("label_issues", "outliers"):
        health.set_int_custom_property(key, result[key])


def _multi_label_issues(
    examples: Examples, names: List[str], vectors: Optional[np.ndarray], hp, result: Dict[str, Any]
) -> List[Dict[str, str]]:
    """The multi-label label check on the sample (label_issues.rank_multi_label): its rows for label_issues.csv,
    and its method, the accuracy of its model (the share of label bits it gets right) or why it was skipped, into
    `result`. The given and suggested labels are label sets, ';'-separated (empty: none)."""
    chosen = range(len(examples.keys))
    # A label only eval images have is not in Transform's vocabulary (id -1): no label of the check.
    known = [[c for c in labels if 0 <= c < len(names)] for labels in examples.labels]
    hot = label_issues.multi_hot(known, len(names))
    folds, why = label_issues.multi_label_folds(
        hot, label_issues.FOLDS if vectors is not None else label_issues.CNN_FOLDS
    )
    if not folds:
        result["label_check_skipped"] = why
        return []
    if vectors is not None:
        probabilities = label_issues.multi_label_probabilities_from_features(vectors, hot, folds, hp.seed)
        result["label_check_method"] = f"{folds}-fold logistic regression per label on backbone features"
    else:
        probabilities = label_issues.multi_label_probabilities_from_pixels(np.stack(examples.pixels), hot, folds, hp)
        result["label_check_method"] = f"{folds}-fold multi-label cnn on pixels"
    result["label_check_accuracy"] = round(float(((probabilities > 0.5) == (hot > 0.5)).mean()), 4)
    return [
        {
            "rank": str(n),
            "path": examples.paths[chosen[s.index]],
            "split": examples.splits[chosen[s.index]],
            "given": label_set(names[c] for c in s.given),
            "suggested": label_set(names[c] for c in s.suggested),
            "given_probability": f"{s.quality:.4f}",
            "key": examples.keys[chosen[s.index]],
        }
        for n, s in enumerate(label_issues.rank_multi_label(known, probabilities), start=1)
    ]


def _read_json(path: str) -> Optional[Dict]:
    return json.loads(io_utils.read_string_file(path)) if fileio.exists(path) else None
