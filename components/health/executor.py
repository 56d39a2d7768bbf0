"""DataHealth's executor: reads Transform's examples (and the features), runs the checks, writes the report.

Memory is bounded whatever the number of images (the scale benchmark measures it: docs/benchmarks.md). What is
kept of every example is what its rows need: its key, path, split and labels, and four numbers (pixel mean and
spread for poor images, its original size): about 300 bytes an image, a listing's worth. The features are
streamed twice (the outliers: their moments and each training class's centre, then each image's distance to the
nearest centre, 4 bytes an image). The label check runs on at most LABEL_CHECK_SAMPLE images, a sample stratified
by class (every class at least MIN_SAMPLED_PER_CLASS, or all its images) and chosen by content hash (bits the split
does not use: train and eval alike), so the same images each run: only their features (~5 kB an image at 1,280
values) or, for the opt-in `cnn` check, their pixels at most 32 px a side are held. On sets of up to LABEL_CHECK_SAMPLE images every image is checked, as before; above,
health.json says how many were, and the share of suspects is estimated class by class.
"""

import array
import dataclasses
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from absl import logging
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components.example_gen import SUMMARY_FILE as INGESTION_SUMMARY
from components.example_gen.listing import label_set
from components.health import (HEALTH_FILE, LABEL_ISSUES_FILE, OUTLIERS_FILE, TRUSTED_ACCURACY, Limits, checks,
                               label_issues)
from storage.output_files import FEATURE_PROFILE_FILE, FEATURES_SOURCE_FILE, KERAS_DIR
from storage.relocation import pipeline_root_of, relocate
from storage.spreadsheet import csv_text

SHOWN = 50  # suspects and outliers kept in health.json (all of them are in the CSV files)
# The label check's sample: ~100 MB of 1,280-value features (or ~60 MB of 32 px pixels), and k-fold fits of a few
# minutes at most; every class at least this many of its images (or all of them).
LABEL_CHECK_SAMPLE = 20_000
MIN_SAMPLED_PER_CLASS = 50


class Examples:
    """What the checks need of every example, in reading order, train then eval; and of the label check's sample,
    its features (or pixels)."""

    def __init__(self):
        self.keys: List[str] = []
        self.paths: List[str] = []
        self.splits: List[str] = []
        self.labels: List[Any] = []  # class ids; multi-label: each image's list of label ids
        # pixel mean and spread, original height and width
        self.means, self.stds = array.array("f"), array.array("f")
        self.heights, self.widths = array.array("l"), array.array("l")
        self.sampled: List[int] = []  # the label check's sample: indices into the above
        self.pixels: List[np.ndarray] = []  # the sample's, for the cnn label check
        self.vectors: Dict[str, np.ndarray] = {}  # the sample's plain feature vectors, by key
        self.nearest: Optional[np.ndarray] = None  # each image's distance to the nearest train class (features)

    def stats(self, i: int) -> tuple:
        return float(self.means[i]), float(self.stds[i]), int(self.heights[i]), int(self.widths[i])


class Sample:
    """Which images the label check holds: per class the share that keeps LABEL_CHECK_SAMPLE images in all (a
    multi-label image: one share for all), an image kept when its content hash's position is under its share."""

    def __init__(self, counts: Dict[Any, int], multi_label: bool, most: int = LABEL_CHECK_SAMPLE):
        total = sum(counts.values())
        self.total = total
        if total <= most:
            self.shares: Dict[Any, float] = {}
            self.uniform = 1.0
        elif multi_label:
            self.shares, self.uniform = {}, most / total
        else:
            self.shares = {c: min(1.0, max(MIN_SAMPLED_PER_CLASS, most * n / total) / n) for c, n in counts.items() if n}
            self.uniform = 1.0

    def keeps(self, key: str, label: Any) -> bool:
        share = self.uniform if not self.shares else self.shares.get(label, 1.0)
        return share >= 1.0 or sample_position(key) < share


def sample_position(key: str) -> float:
    """Where an image falls in the sample's order: the content hash's second 64 bits (the first place it in its
    split, example_gen/stratify.py: a sample by those would hold the train split only)."""
    return int(key[16:32], 16) / 2.0 ** 64


def read(transformed: types.Artifact, features: Optional[types.Artifact], hp, sample: Sample, keep_pixels: bool,
         multi_label: bool = False) -> Examples:
    import tensorflow as tf

    from trainer import features as names

    found = Examples()
    spec = {names.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string),
            **names.label_spec(multi_label),
            names.KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
            names.FILENAME_KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
            "original_height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
            "original_width": tf.io.FixedLenFeature([], tf.int64, default_value=0)}
    for split in ("train", "eval"):
        files = fileio.glob(os.path.join(artifact_utils.get_split_uri([transformed], split), "*"))
        records = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(256)
        for batch in records:
            parsed = tf.io.parse_example(batch, spec)
            pixels = names.decode_pixels(parsed[names.PIXELS_KEY], hp.image_size, hp.channels)
            gray = tf.reduce_mean(pixels, axis=-1)
            means, stds = tf.reduce_mean(gray, axis=[1, 2]).numpy(), tf.math.reduce_std(gray, axis=[1, 2]).numpy()
            labels = (tf.RaggedTensor.from_sparse(parsed[names.LABELS_KEY]).to_list() if multi_label
                      else [int(n) for n in parsed[names.LABEL_KEY].numpy()])
            kept = []
            for i, key in enumerate(parsed[names.KEY].numpy()):
                key = key.decode()
                if sample.keeps(key, None if multi_label else labels[i]):
                    found.sampled.append(len(found.keys))
                    kept.append(i)
                found.keys.append(key)
                found.paths.append(parsed[names.FILENAME_KEY][i].numpy().decode("utf-8", "replace"))
                found.splits.append(split)
                found.labels.append(labels[i])
                found.means.append(float(means[i]))
                found.stds.append(float(stds[i]))
                found.heights.append(int(parsed["original_height"][i]))
                found.widths.append(int(parsed["original_width"][i]))
            if keep_pixels and kept:  # for the cnn label check, at most CNN_MAX_SIZE a side
                chosen = tf.gather(pixels, kept)
                if hp.image_size > label_issues.CNN_MAX_SIZE:
                    chosen = tf.image.resize(chosen, [label_issues.CNN_MAX_SIZE] * 2, antialias=True)
                found.pixels.extend(np.clip(chosen.numpy(), 0, 255).astype(np.uint8))
    if features is not None:
        _read_features(found, features, multi_label)
    return found


def _feature_batches(features: types.Artifact):
    """(keys, plain vectors [n, dim]) of the features step's output, batch by batch."""
    import tensorflow as tf

    from trainer import features as names

    source = json.loads(io_utils.read_string_file(os.path.join(features.uri, FEATURES_SOURCE_FILE)))
    dim = source["dim"]
    for split in ("train", "eval"):
        views = source["views"].get(split, 0) + 1
        files = fileio.glob(os.path.join(artifact_utils.get_split_uri([features], split), "*"))
        fspec = {names.FEATURES_KEY: tf.io.FixedLenFeature([views * dim], tf.float32),
                 names.KEY: tf.io.FixedLenFeature([], tf.string)}
        for batch in tf.data.TFRecordDataset(files, compression_type=names.compression(files)).batch(1024):
            parsed = tf.io.parse_example(batch, fspec)
            yield [k.decode() for k in parsed[names.KEY].numpy()], parsed[names.FEATURES_KEY].numpy()[:, :dim]


class _Aligned:
    """Each feature record's example (its index in reading order), by key: copies of one image (identical pixels in
    one split) are examples each, and records each, matched one to one."""

    def __init__(self, keys: List[str]):
        self._next: Dict[str, int] = {}  # each key's first example not yet matched (an int an image, as an index)
        self._copies: Dict[str, List[int]] = {}  # the later examples of a key met more than once (rare)
        for i, key in enumerate(keys):
            if key in self._next:
                self._copies.setdefault(key, []).append(i)
            else:
                self._next[key] = i

    def rows(self, keys: List[str]) -> List[int]:
        return [self._match(k) for k in keys]

    def _match(self, key: str) -> int:
        row = self._next.pop(key, -1)
        later = self._copies.get(key)
        if row >= 0 and later:
            self._next[key] = later.pop(0)
            if not later:
                del self._copies[key]
        return row


def _read_features(found: Examples, features: types.Artifact, multi_label: bool) -> None:
    """The sample's vectors; and, for the outliers (one class an image), every image's distance to the nearest
    training class centre in standardised features, from two streaming passes: the features' moments and the
    classes' sums, then the distances."""
    sampled = {found.keys[i] for i in found.sampled}
    labels = None if multi_label else np.asarray(found.labels, np.int64)
    train = np.asarray([s == "train" for s in found.splits]) if labels is not None else None
    count, total, squares, class_sums, class_counts = 0, None, None, {}, {}
    first_pass = _Aligned(found.keys) if labels is not None else None  # one map of keys at a time (~50-70 B an image)
    for keys, vectors in _feature_batches(features):
        for key, vector in zip(keys, vectors):
            if key in sampled:
                found.vectors[key] = vector.astype(np.float32)
        if labels is None:
            continue
        wide = vectors.astype(np.float64)
        total = wide.sum(axis=0) if total is None else total + wide.sum(axis=0)
        squares = (wide ** 2).sum(axis=0) if squares is None else squares + (wide ** 2).sum(axis=0)
        count += len(wide)
        for j, i in enumerate(first_pass.rows(keys)):
            if i >= 0 and train[i]:
                c = int(labels[i])
                class_sums[c] = class_sums.get(c, 0.0) + wide[j]
                class_counts[c] = class_counts.get(c, 0) + 1
    first_pass = None
    if labels is None or count <= 2 or not class_sums:
        return
    mean = total / count
    scale = np.sqrt(np.maximum(squares / count - mean ** 2, 0.0)) + 1e-6
    centres = np.stack([(class_sums[c] / class_counts[c] - mean) / scale for c in sorted(class_sums)]).astype(
        np.float32)
    found.nearest = np.full(len(found.keys), np.nan, np.float32)
    second_pass = _Aligned(found.keys)
    for keys, vectors in _feature_batches(features):
        rows = np.asarray(second_pass.rows(keys))
        distances = checks.nearest_centre(((vectors - mean) / scale).astype(np.float32), centres)
        found.nearest[rows[rows >= 0]] = distances[rows >= 0]


def _class_names(transform_graph: types.Artifact) -> Tuple[List[str], bool]:
    """(the class names in id order, whether the examples are multi-label)."""
    import tensorflow_transform as tft

    from trainer import features as names

    output = tft.TFTransformOutput(transform_graph.uri)
    return ([n.decode() for n in output.vocabulary_by_name(names.LABEL_VOCABULARY)],
            names.is_multi_label(output.transformed_feature_spec()))


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        from trainer.hparams import HParams

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
        examples = read(transformed, features, hp, sample, keep_pixels=check_labels and features is None,
                        multi_label=multi_label)
        labels = np.asarray(examples.labels) if not multi_label else None
        result: Dict[str, Any] = {"examples": len(examples.labels), "label_check": mode,
                                  **({"task": "multi"} if multi_label else {})}

        # Near-duplicates: found at ingestion; their share of eval is gated here with the rest (None: not searched,
        # --near-duplicates off).
        near = ingestion.get("near_duplicate_eval_leak_fraction", 0.0)
        near = None if near is None else float(near)
        result["near_duplicate_eval_leak_fraction"] = near

        if not check_labels:
            issue_rows = []
        else:
            vectors = np.stack([examples.vectors[examples.keys[i]] for i in examples.sampled]) \
                if features is not None else None
            issue_rows = (_multi_label_issues if multi_label else _single_label_issues)(
                examples, names, vectors, hp, result)
        result["label_issues"] = len(issue_rows)
        result["label_issue_fraction"] = (_issue_fraction(examples, issue_rows, multi_label)
                                          if "label_check_method" in result else None)  # None: not checked
        result["label_issue_examples"] = issue_rows[:SHOWN]
        if check_labels and len(examples.sampled) < len(examples.keys):
            result["label_check_sampled"] = len(examples.sampled)  # of result["examples"]

        outlier_rows = _outliers(examples, names, labels, multi_label)
        result["outliers"] = len(outlier_rows)
        result["outlier_examples"] = outlier_rows[:SHOWN]

        drift = _feature_drift(features, baseline, health.uri, result)
        limits = Limits(**{f.name: float(exec_properties[f.name]) for f in dataclasses.fields(Limits)})
        # A weak check's share of suspects (a model that is often wrong suspects many) stops nothing: the
        # summary and the report say that its ranking is unreliable.
        trusted = result.get("label_check_accuracy", 1.0) >= TRUSTED_ACCURACY
        found = checks.problems(near, result["label_issue_fraction"] if trusted else None, drift, limits)
        # The class mix: warned about, never stopping the run (the Evaluator judges every class it can).
        warnings = checks.class_warnings(ingestion.get("examples_per_split_and_class") or {})
        result.update(problems=found, warnings=warnings, limits=dataclasses.asdict(limits),
                      seconds=round(time.monotonic() - started, 2))

        _write(health, result, issue_rows, outlier_rows)
        logging.info("DataHealth: %d label issues, %d outliers, near-duplicate eval share %s, feature drift %s",
                     result["label_issues"], len(outlier_rows), "not searched" if near is None else f"{near:.3f}", drift)
        if found:  # DataHealthGate stops the run on them (or warns), after these files are kept
            logging.warning("DataHealth: %s", checks.describe(found))
        for warning in warnings:
            logging.warning("DataHealth: %s", warning["text"])


def _class_counts(ingestion: Dict[str, Any], names: List[str], multi_label: bool) -> Dict[Any, int]:
    """Images per class id in train and eval (multi-label: {None: images}), from ingestion's summary: the label
    check's sample is chosen before anything is read."""
    if multi_label:
        return {None: sum(n for split, n in (ingestion.get("examples_per_split") or {}).items()
                          if split in ("train", "eval"))}
    ids = {name: i for i, name in enumerate(names)}
    counts: Dict[Any, int] = {}
    for split in ("train", "eval"):
        for name, n in ((ingestion.get("examples_per_split_and_class") or {}).get(split) or {}).items():
            counts[ids.get(name, -1)] = counts.get(ids.get(name, -1), 0) + n
    return counts


def _issue_fraction(examples: Examples, issue_rows: List[Dict[str, str]], multi_label: bool) -> float:
    """The share of images that look mislabelled: of all of them when every image was checked; else estimated
    from the sample, class by class (each class's share of suspects in its sample, weighed by its images)."""
    total = len(examples.keys)
    if len(examples.sampled) == total or multi_label:
        return round(len(issue_rows) / max(1, len(examples.sampled)), 6)
    sampled_per_class: Dict[int, int] = {}
    for i in examples.sampled:
        sampled_per_class[examples.labels[i]] = sampled_per_class.get(examples.labels[i], 0) + 1
    all_per_class: Dict[int, int] = {}
    for label in examples.labels:
        all_per_class[label] = all_per_class.get(label, 0) + 1
    suspects: Dict[int, int] = {}
    index = {examples.keys[i]: i for i in examples.sampled}
    for row in issue_rows:
        label = examples.labels[index[row["key"]]]
        suspects[label] = suspects.get(label, 0) + 1
    estimate = sum(n / sampled_per_class[c] * all_per_class[c] for c, n in suspects.items()) / total
    return round(estimate, 6)


def _single_label_issues(examples: Examples, names: List[str], vectors: Optional[np.ndarray], hp,
                         result: Dict[str, Any]) -> List[Dict[str, str]]:
    """The label check on the sample (label_issues.rank, confident learning on out-of-sample probabilities): its
    rows for label_issues.csv, and its method, the accuracy of its model or why it was skipped, into `result`."""
    chosen = examples.sampled
    labels = np.asarray([examples.labels[i] for i in chosen], np.int64)
    ids, contiguous = np.unique(labels, return_inverse=True)
    folds, why = label_issues.folds_for(
        contiguous, label_issues.FOLDS if vectors is not None else label_issues.CNN_FOLDS)
    if not folds:
        result["label_check_skipped"] = why
        return []
    probabilities = label_issues.out_of_sample(
        contiguous, vectors, np.stack(examples.pixels) if vectors is None else None, hp, folds)
    suspects = [s._replace(given=int(ids[s.given]), suggested=int(ids[s.suggested]))
                for s in label_issues.rank(contiguous, probabilities)]
    result["label_check_method"] = (f"{folds}-fold logistic regression on backbone features"
                                    if vectors is not None else f"{folds}-fold cnn on pixels")
    # How good the check's model is: confident learning ranks well only when it is good.
    result["label_check_accuracy"] = round(float((probabilities.argmax(axis=1) == contiguous).mean()), 4)
    return [{"rank": str(n), "path": examples.paths[chosen[s.index]], "split": examples.splits[chosen[s.index]],
             "given": names[s.given], "suggested": names[s.suggested],
             "given_probability": f"{s.given_probability:.4f}", "key": examples.keys[chosen[s.index]]}
            for n, s in enumerate(suspects, start=1)]


def _outliers(examples: Examples, names: List[str], labels: Optional[np.ndarray],
              multi_label: bool) -> List[Dict[str, str]]:
    """outliers.csv's rows: poor images (flat, tiny, extreme), and with features, images far from every class
    (multi-label: an image is no one class's, so that is not asked)."""
    outlier_rows = []
    far = checks.far_out(examples.nearest) if examples.nearest is not None else np.zeros(len(examples.keys), bool)
    for i in range(len(examples.keys)):
        reasons = checks.poor_image_reasons(*examples.stats(i))
        if far[i]:
            reasons.append("far from every class (feature space)")
        if reasons:
            label = (label_set(names[c] for c in examples.labels[i] if 0 <= c < len(names)) if multi_label
                     else names[labels[i]])
            outlier_rows.append({"path": examples.paths[i], "split": examples.splits[i], "label": label,
                                 "reasons": "; ".join(reasons), "key": examples.keys[i]})
    return outlier_rows


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
    io_utils.write_string_file(os.path.join(health.uri, LABEL_ISSUES_FILE), csv_text(
        ("rank", "path", "split", "given", "suggested", "given_probability", "key"), issue_rows))
    io_utils.write_string_file(os.path.join(health.uri, OUTLIERS_FILE), csv_text(
        ("path", "split", "label", "reasons", "key"), outlier_rows))
    for key in ("label_issues", "outliers"):
        health.set_int_custom_property(key, result[key])


def _multi_label_issues(examples: Examples, names: List[str], vectors: Optional[np.ndarray], hp,
                        result: Dict[str, Any]) -> List[Dict[str, str]]:
    """The multi-label label check on the sample (label_issues.rank_multi_label): its rows for label_issues.csv,
    and its method, the accuracy of its model (the share of label bits it gets right) or why it was skipped, into
    `result`. The given and suggested labels are label sets, ';'-separated (empty: none)."""
    chosen = examples.sampled
    # A label only eval images have is not in Transform's vocabulary (id -1): no label of the check.
    known = [[c for c in examples.labels[i] if 0 <= c < len(names)] for i in chosen]
    hot = label_issues.multi_hot(known, len(names))
    folds, why = label_issues.multi_label_folds(hot, label_issues.FOLDS if vectors is not None
                                                else label_issues.CNN_FOLDS)
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
    return [{"rank": str(n), "path": examples.paths[chosen[s.index]], "split": examples.splits[chosen[s.index]],
             "given": label_set(names[c] for c in s.given),
             "suggested": label_set(names[c] for c in s.suggested),
             "given_probability": f"{s.quality:.4f}", "key": examples.keys[chosen[s.index]]}
            for n, s in enumerate(label_issues.rank_multi_label(known, probabilities), start=1)]


def _read_json(path: str) -> Optional[Dict]:
    return json.loads(io_utils.read_string_file(path)) if fileio.exists(path) else None
