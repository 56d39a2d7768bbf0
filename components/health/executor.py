"""DataHealth's executor: reads Transform's examples (and the features), runs the checks, writes the report.

Reads every example once, streaming: from the pixels only two numbers an image are kept (mean and
spread, for poor images), unless the `cnn` label check needs them; the features (a few kB an image)
are kept for the label check and the outliers. Memory: about 5 kB an image with features (20,000
images: ~100 MB), or, for the opt-in `cnn` check, the pixels at most 32 px a side (3 kB an image).
"""

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


class Examples:
    """What the checks need of every example, in reading order, train then eval."""

    def __init__(self):
        self.keys: List[str] = []
        self.paths: List[str] = []
        self.splits: List[str] = []
        self.labels: List[Any] = []  # class ids; multi-label: each image's list of label ids
        self.stats: List[tuple] = []  # (mean, std, original height, original width)
        self.pixels: List[np.ndarray] = []
        self.vectors: Dict[str, np.ndarray] = {}  # key -> plain feature vector


def read(transformed: types.Artifact, features: Optional[types.Artifact], hp, keep_pixels: bool,
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
            for i, key in enumerate(parsed[names.KEY].numpy()):
                found.keys.append(key.decode())
                found.paths.append(parsed[names.FILENAME_KEY][i].numpy().decode("utf-8", "replace"))
                found.splits.append(split)
                found.labels.append(labels[i])
                found.stats.append((float(means[i]), float(stds[i]), int(parsed["original_height"][i]),
                                    int(parsed["original_width"][i])))
            if keep_pixels:  # for the cnn label check, at most CNN_MAX_SIZE a side
                if hp.image_size > label_issues.CNN_MAX_SIZE:
                    pixels = tf.image.resize(pixels, [label_issues.CNN_MAX_SIZE] * 2, antialias=True)
                found.pixels.extend(np.clip(pixels.numpy(), 0, 255).astype(np.uint8))
    if features is not None:
        source = json.loads(io_utils.read_string_file(os.path.join(features.uri, FEATURES_SOURCE_FILE)))
        dim = source["dim"]
        for split in ("train", "eval"):
            views = source["views"].get(split, 0) + 1
            files = fileio.glob(os.path.join(artifact_utils.get_split_uri([features], split), "*"))
            fspec = {names.FEATURES_KEY: tf.io.FixedLenFeature([views * dim], tf.float32),
                     names.KEY: tf.io.FixedLenFeature([], tf.string)}
            for batch in tf.data.TFRecordDataset(files, compression_type=names.compression(files)).batch(1024):
                parsed = tf.io.parse_example(batch, fspec)
                for key, vector in zip(parsed[names.KEY].numpy(), parsed[names.FEATURES_KEY].numpy()):
                    found.vectors[key.decode()] = vector[:dim].astype(np.float32)  # the plain view
    return found


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
        examples = read(transformed, features, hp, keep_pixels=check_labels and features is None,
                        multi_label=multi_label)
        labels = np.asarray(examples.labels) if not multi_label else None
        result: Dict[str, Any] = {"examples": len(examples.labels), "label_check": mode,
                                  **({"task": "multi"} if multi_label else {})}

        # Near-duplicates: found at ingestion; their share of eval is gated here with the rest (None: not searched,
        # --near-duplicates off).
        ingestion = json.loads(io_utils.read_string_file(os.path.join(report.uri, INGESTION_SUMMARY)))
        near = ingestion.get("near_duplicate_eval_leak_fraction", 0.0)
        near = None if near is None else float(near)
        result["near_duplicate_eval_leak_fraction"] = near

        vectors = None
        if features is not None and examples.vectors:
            vectors = np.stack([examples.vectors[k] for k in examples.keys])
        if not check_labels:
            issue_rows = []
        elif multi_label:
            issue_rows = _multi_label_issues(examples, names, vectors, hp, result)
        else:
            issue_rows = _single_label_issues(examples, names, labels, vectors, hp, result)
        result["label_issues"] = len(issue_rows)
        result["label_issue_fraction"] = (round(len(issue_rows) / max(1, len(examples.labels)), 6)
                                          if "label_check_method" in result else None)  # None: not checked
        result["label_issue_examples"] = issue_rows[:SHOWN]

        outlier_rows = _outliers(examples, names, labels, vectors, multi_label)
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


def _single_label_issues(examples: Examples, names: List[str], labels: np.ndarray, vectors: Optional[np.ndarray],
                         hp, result: Dict[str, Any]) -> List[Dict[str, str]]:
    """The label check (label_issues.rank, confident learning on out-of-sample probabilities): its rows for
    label_issues.csv, and its method, the accuracy of its model or why it was skipped, into `result`."""
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
    return [{"rank": str(n), "path": examples.paths[s.index], "split": examples.splits[s.index],
             "given": names[s.given], "suggested": names[s.suggested],
             "given_probability": f"{s.given_probability:.4f}", "key": examples.keys[s.index]}
            for n, s in enumerate(suspects, start=1)]


def _outliers(examples: Examples, names: List[str], labels: Optional[np.ndarray], vectors: Optional[np.ndarray],
              multi_label: bool) -> List[Dict[str, str]]:
    """outliers.csv's rows: poor images (flat, tiny, extreme), and with features, images far from every class."""
    outlier_rows = []
    far = np.zeros(len(examples.labels), bool)
    # (multi-label: an image is no one class's, so "far from every class" is not asked)
    if vectors is not None and labels is not None and len(labels) > 2:
        z = ((vectors - vectors.mean(axis=0)) / (vectors.std(axis=0) + 1e-6)).astype(np.float32)
        far, _ = checks.far_from_every_class(z, labels, np.asarray(examples.splits) == "train")
    for i, (mean, std, height, width) in enumerate(examples.stats):
        reasons = checks.poor_image_reasons(mean, std, height, width)
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
    """The multi-label label check (label_issues.rank_multi_label): its rows for label_issues.csv, and its method,
    the accuracy of its model (the share of label bits it gets right) or why it was skipped, into `result`. The
    given and suggested labels are label sets, ';'-separated (empty: none)."""
    # A label only eval images have is not in Transform's vocabulary (id -1): no label of the check.
    known = [[c for c in ids if 0 <= c < len(names)] for ids in examples.labels]
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
    return [{"rank": str(n), "path": examples.paths[s.index], "split": examples.splits[s.index],
             "given": label_set(names[c] for c in s.given),
             "suggested": label_set(names[c] for c in s.suggested),
             "given_probability": f"{s.quality:.4f}", "key": examples.keys[s.index]}
            for n, s in enumerate(label_issues.rank_multi_label(known, probabilities), start=1)]


def _read_json(path: str) -> Optional[Dict]:
    return json.loads(io_utils.read_string_file(path)) if fileio.exists(path) else None
