"""The Evaluator on the features step's cached features: TFMA scores the candidate's head (trainer/head_export.py), and
the baseline's, on the eval split's feature records, instead of running each serving model's decode, resize and
backbone on every eval image again (the features step ran that backbone on these very images).

Taken only when it is the same model: every compared model has its head exported for these features (the same
fingerprint: backbone, weights, input size), and each compared model's serving model agrees with its head on the first
AGREEMENT_IMAGES eval images (every probability within AGREEMENT_TOLERANCE). Otherwise TFMA runs the serving models
on the raw examples, as before, and the log says why. evaluated_on.json in the evaluation says which, and the
sample's largest difference. The explanations, the class gate and the profile still read the raw examples.
"""

import json
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils, path_utils

from components.evaluator.eval_config import EVALUATED_ON_FILE
from components.evaluator.results import json_file
from images import feature_keys as keys
from trainer import features
from trainer.artifact_files import FEATURES_SOURCE_FILE, HEAD_DIR, HEAD_INFO

FEATURES_KEY = "features"  # the Evaluator's optional input: the features step's output
AGREEMENT_IMAGES = 32  # eval images the serving model and the head both classify before the head is trusted
# The largest difference allowed between their probabilities: ONNX Runtime's features are within 1e-4 of
# TensorFlow's (components/features/runtimes.py); a model whose backbone is not the features step's (warm-started
# from a fine-tuned model) differs by far more.
AGREEMENT_TOLERANCE = 1e-3


def _head_of(model, fingerprint: str):
    """A copy of the Model artifact pointing at its head (same id: TFX records it in the blessing), or None when it
    has none for these features."""
    info = json_file(os.path.join(model.uri, HEAD_DIR), HEAD_INFO)
    if not info or info.get("fingerprint") != fingerprint:
        return None
    copied = type(model.mlmd_artifact)()
    copied.CopyFrom(model.mlmd_artifact)  # the candidate's artifact keeps its own folder
    head = artifact_utils.deserialize_artifact(model.artifact_type, copied)
    head.uri = os.path.join(model.uri, HEAD_DIR)
    return head


def heads(input_dict, splits: List[str]) -> Tuple[Optional[Dict[str, list]], str]:
    """(input_dict with the features as examples and the heads as models, "") when every compared model has a head
    for the features and the features hold `splits`; else (None, why not)."""
    found = input_dict.get(FEATURES_KEY) or []
    if not found:
        return None, "no features step in this run"
    computed = found[0]
    source = json_file(computed.uri, FEATURES_SOURCE_FILE) or {}
    if not set(splits) <= set(artifact_utils.decode_split_names(computed.split_names)):
        return None, f"the features hold no {', '.join(splits)} split"
    swapped = {k: v for k, v in input_dict.items() if k != FEATURES_KEY}
    swapped[standard_component_specs.EXAMPLES_KEY] = [computed]
    for key in (standard_component_specs.MODEL_KEY, standard_component_specs.BASELINE_MODEL_KEY):
        for model in input_dict.get(key) or []:
            head = _head_of(model, source.get("fingerprint"))
            if head is None:
                which = "the candidate" if key == standard_component_specs.MODEL_KEY else "the last blessed model"
                return None, f"{which} has no head for these features (fine-tuned, a cnn, multi-label or older)"
            swapped[key] = [head]
    return swapped, ""


class Sample(NamedTuple):
    """The first eval images' raw records and their feature records, in the same order (None: an image has no
    feature record), read once for every compared model."""

    raw: List[bytes]
    features: Optional[List[bytes]]


def sample(examples_uri: str, features_uri: str, images: int = AGREEMENT_IMAGES) -> Sample:
    """The first `images` eval records and the feature records of the same images (matched by the image's key)."""
    raw_files = sorted(tf.io.gfile.glob(os.path.join(examples_uri, "Split-eval", "*")))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(raw_files, features.compression(raw_files)).take(images)]
    if not raw:
        return Sample([], [])
    wanted = tf.io.parse_example(raw, {keys.SHA256: tf.io.FixedLenFeature([], tf.string)})[keys.SHA256].numpy()
    keys_wanted = set(wanted.tolist())
    found = _feature_records(features_uri, keys_wanted)
    return Sample(raw, [found[k] for k in wanted] if len(found) == len(keys_wanted) else None)


def agreement(model_uri: str, on: Sample, load: Callable[[str], Any] = tf.saved_model.load) -> float:
    """The largest difference between the model's serving probabilities and its head's on the sample's images; inf
    when an image has no feature record. `load`: what loads each SavedModel."""
    if not on.raw:
        return 0.0
    if on.features is None:
        return float("inf")
    serving = load(path_utils.serving_model_path(model_uri)).signatures["serving_examples"]
    served = serving(examples=tf.constant(on.raw))["probabilities"].numpy()
    head = load(path_utils.serving_model_path(os.path.join(model_uri, HEAD_DIR)))
    by_head = head.signatures["serving_examples"](examples=tf.constant(on.features))["probabilities"]
    return float(np.max(np.abs(served - by_head.numpy())))


class RecordScores:
    """The candidate's most likely class and its probability for eval images, by key, from records of the eval images
    that TFMA scored (`probabilities_of`: a batch of them -> their probabilities): the head on the features step's
    records (head_scores), or the prediction records (predictions.py), without running the backbone again. The records
    are read forward once, only as far as the keys asked for need, and each record read keeps its two numbers (a few
    tens of bytes an eval image)."""

    def __init__(self, records_uri: str, probabilities_of: Callable[[tf.Tensor], np.ndarray]):
        files = sorted(tf.io.gfile.glob(os.path.join(records_uri, "Split-eval", "*")))
        self._batches = iter(features.record_batches(files, 256))
        self._probabilities_of = probabilities_of
        self._read: Dict[bytes, Tuple[int, float]] = {}

    def __call__(self, wanted: List[bytes]) -> Optional[List[Tuple[int, float]]]:
        """(class id, probability) of each wanted key's image, in order; None when one has no record."""
        while any(k not in self._read for k in wanted):
            batch = next(self._batches, None)
            if batch is None:
                return None
            parsed = tf.io.parse_example(batch, {features.KEY: tf.io.FixedLenFeature([], tf.string, default_value="")})
            probabilities = self._probabilities_of(batch)
            best = zip(probabilities.argmax(axis=1).tolist(), probabilities.max(axis=1).tolist())
            self._read.update(zip(parsed[features.KEY].numpy().tolist(), best))
        return [self._read[k] for k in wanted]


def head_scores(scored: Dict[str, list], load: Callable[[str], Any] = tf.saved_model.load) -> RecordScores:
    """The candidate's head on the features step's eval feature records: what TFMA scored when it scored the heads
    (`scored`: choose()'s input_dict on the features)."""
    head = load(path_utils.serving_model_path(scored[standard_component_specs.MODEL_KEY][0].uri))
    serving = head.signatures["serving_examples"]
    return RecordScores(
        scored[standard_component_specs.EXAMPLES_KEY][0].uri,
        lambda batch: serving(examples=batch)["probabilities"].numpy(),
    )


def _feature_records(features_uri: str, wanted: set) -> Dict[bytes, bytes]:
    """The eval feature records of the images whose key is in `wanted`, by key (read until all are found)."""
    files = sorted(tf.io.gfile.glob(os.path.join(features_uri, "Split-eval", "*")))
    found: Dict[bytes, bytes] = {}
    for batch in tf.data.TFRecordDataset(files, features.compression(files)).batch(256):
        parsed = tf.io.parse_example(batch, {features.KEY: tf.io.FixedLenFeature([], tf.string, default_value="")})
        for key, record in zip(parsed[features.KEY].numpy(), batch.numpy()):
            if key in wanted:
                found[key] = record
        if len(found) == len(wanted):
            break
    return found


def plain(input_dict) -> Dict[str, list]:
    """input_dict as TFX's Evaluator reads it: the raw examples and the serving models."""
    return {k: v for k, v in input_dict.items() if k != FEATURES_KEY}


def choose(
    input_dict, splits: List[str], load: Callable[[str], Any] = tf.saved_model.load
) -> Tuple[Dict[str, list], Dict[str, Any]]:
    """(the input_dict TFMA reads, what evaluated_on.json records): the heads on the features when they agree with
    the serving model, else the serving models on the raw examples. `load`: what loads each SavedModel compared."""
    swapped, why = heads(input_dict, splits)
    if swapped is None:
        return plain(input_dict), {"on": "serving model", "why": why}
    examples, computed = input_dict[standard_component_specs.EXAMPLES_KEY][0], input_dict[FEATURES_KEY][0]
    # Each compared model: a last blessed model may have been scored on its serving model (its head disagreed)
    compared = [
        m
        for k in (standard_component_specs.MODEL_KEY, standard_component_specs.BASELINE_MODEL_KEY)
        for m in input_dict.get(k) or []
    ]
    on = sample(examples.uri, computed.uri)  # read once: the same images for every compared model
    difference = max(agreement(model.uri, on, load) for model in compared)
    record = {"agreement_images": AGREEMENT_IMAGES, "largest_difference": difference if difference < 1e9 else None}
    if not difference <= AGREEMENT_TOLERANCE:
        why = f"the serving model and its head disagree by {difference:.2g} on the first eval images"
        logging.warning("Evaluator: scoring the serving model on every eval image: %s", why)
        return plain(input_dict), {"on": "serving model", "why": why, **record}
    logging.info("Evaluator: scoring the heads on the features step's features (agreement %.2g)", difference)
    return swapped, {"on": "features", **record}


def write_record(evaluation_uri: str, record: Dict[str, Any]) -> None:
    io_utils.write_string_file(os.path.join(evaluation_uri, EVALUATED_ON_FILE), json.dumps(record, indent=1))
