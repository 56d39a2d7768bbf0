"""The Evaluator on prediction records, where it scores serving models on raw eval images (the candidate has no head
for the features step's features, a head disagrees, or there is no features step): each compared model runs once over
the eval (and test) images, in batches, and its probabilities are written beside each image's key and label; TFMA
then scores a reader of those records, and the look at eval images (misclassified, explanations) takes each image's
class from them.

Before, TFMA ran each model's transform_features (a decode and resize, for the label) and serving_examples (the
decode, resize and backbone again) on every eval image, and the look at eval images ran the serving model a third time
on the first ones: 30 ms an eval image at 224 px (a fine-tuned model, 10,000-image run). Here each image is decoded
and scored once, by the serving model, or by its Keras model on ONNX Runtime once that agreed with it (ServingPass).

    <evaluation>/predictions/records/Split-<split>/predictions-00000-of-00001.gz
        key (image/key/sha256), label (the class id in the models' classes, -1 for a name they do not know: Transform's
        vocabulary default) or labels (multi-label: multi-hot), and <slot>/probabilities for each compared model
    <evaluation>/predictions/<slot>/Format-Serving
        a SavedModel whose serving_examples gives that slot's probabilities and transform_features its label

Taken where the Evaluator's Beam runs in its own process (TFMA on Dataflow keeps its workers: the pass would run on
the Evaluator's one machine) and every compared model records the same classes (the label ids are theirs).
evaluated_on.json says which, the pass's images and seconds, and each model's runtime.
"""

import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import path_utils

from components.evaluator.eval_config import INFERENCE_BATCH
from components.evaluator.on_features import AGREEMENT_IMAGES, AGREEMENT_TOLERANCE, RecordScores, plain
from components.features import runtimes
from components.freed_memory import give_back_freed_memory
from images import feature_keys as keys
from stacks import IN_PROCESS_BEAM_RUNNERS
from trainer import features

PREDICTIONS_DIR = "predictions"  # in the evaluation
RECORDS_DIR = "records"  # in PREDICTIONS_DIR: the Examples TFMA reads
RECORDS_FILE = "predictions-00000-of-00001.gz"
# Images ONNX Runtime scores a run: 16 are as fast as 64 (5.8 against 6.0 ms an image, EfficientNet-Lite0 at 224 px)
# and its arena holds a quarter of their activations (64: ~1 GB more than TensorFlow's pass)
ONNX_CHUNK = 16
# The compared models, by input key: each one's probabilities column and its reader's folder
SLOTS = {standard_component_specs.MODEL_KEY: "candidate", standard_component_specs.BASELINE_MODEL_KEY: "baseline"}


def probabilities_key(slot: str) -> str:
    return f"{slot}/probabilities"


class ReaderModule(tf.Module):
    """A compared model's probabilities and the image's label, read back from the prediction records under the
    signatures TFMA calls (the serving model's names)."""

    def __init__(self, slot: str, classes: int, multi_label: bool):
        super().__init__(name=f"{slot}_predictions")
        self._probabilities = {probabilities_key(slot): tf.io.FixedLenFeature([classes], tf.float32)}
        self._label = (
            {features.LABELS_KEY: tf.io.FixedLenFeature([classes], tf.float32)}
            if multi_label
            else {features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)}
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def serve_examples(self, examples):
        return {"probabilities": next(iter(tf.io.parse_example(examples, self._probabilities).values()))}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def transform_features(self, examples):
        return tf.io.parse_example(examples, self._label)


def why_not(input_dict, infos: Dict[str, Dict[str, Any]], beam_args: List[str]) -> str:
    """Why the prediction records are not written for these compared models ("" when they are)."""
    runner = PipelineOptions(beam_args or []).view_as(StandardOptions).runner or "DirectRunner"
    if runner not in IN_PROCESS_BEAM_RUNNERS:
        return f"TFMA runs on {runner}"
    names = [info.get("class_names") for info in infos.values()]
    if not all(names) or any(n != names[0] for n in names):
        return "a compared model does not record its classes"
    return ""


class Labels:
    """An image's label as Transform's vocabulary gives it the models: a class id (-1 for a name the models do not
    know), or for a multi-label model the multi-hot vector of its known labels."""

    def __init__(self, class_names: List[str], multi_label: bool):
        self._ids = {n.encode("utf-8"): i for i, n in enumerate(class_names)}
        self._classes, self.multi_label = len(class_names), multi_label
        self.text_key = keys.LABELS_TEXT if multi_label else keys.LABEL_TEXT

    def feature(self, names: List[bytes]) -> Tuple[str, tf.train.Feature]:
        if not self.multi_label:
            label = self._ids.get(names[0], -1) if names else -1
            return features.LABEL_KEY, tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
        hot = np.zeros(self._classes, np.float32)
        hot[[self._ids[n] for n in names if n in self._ids]] = 1.0
        return features.LABELS_KEY, tf.train.Feature(float_list=tf.train.FloatList(value=hot))


class ServingPass:
    """A compared model's probabilities for batches of raw eval records: its serving model's, or, on a machine
    without a GPU or TPU, its decode and resize (the serving model's image_pixels) then its Keras model converted to
    ONNX Runtime (components/features/runtimes.py): 6.8 ms an image against the serving model's 11.0, at 224 px with
    EfficientNet-Lite0 on 2 cores, probabilities within 6e-6. The first AGREEMENT_IMAGES images are scored both ways:
    ONNX Runtime scores every image only if each of their probabilities is within on_features.AGREEMENT_TOLERANCE of
    the serving model's (the images and bound the heads on the features are held to), else the serving model does."""

    def __init__(self, loaded, name: str):
        self._serving = loaded.signatures["serving_examples"]
        self._loaded, self._name = loaded, name
        self._onnx = _on_onnx(loaded, name)
        self.runtime = runtimes.ONNX if self._onnx else runtimes.TENSORFLOW
        self.largest_difference: Optional[float] = None

    def __call__(self, batch) -> np.ndarray:
        if self._onnx is None:
            return self._serving(examples=batch)["probabilities"].numpy()
        if self.largest_difference is not None:
            return self._on_onnx(batch)
        on_onnx = self._on_onnx(batch)
        # the serving model on the first AGREEMENT_IMAGES only: its activations for a whole batch stay in the heap
        served = self._serving(examples=batch[:AGREEMENT_IMAGES])["probabilities"].numpy()
        self.largest_difference = float(np.abs(on_onnx[: len(served)] - served).max()) if len(served) else 0.0
        if self.largest_difference <= AGREEMENT_TOLERANCE:
            return on_onnx
        logging.warning(
            "Evaluator: %s on ONNX Runtime differs from its serving model by %.2g; the serving model scores it",
            self._name,
            self.largest_difference,
        )
        self._onnx, self.runtime = None, runtimes.TENSORFLOW
        return self._serving(examples=batch)["probabilities"].numpy()

    def _on_onnx(self, batch) -> np.ndarray:
        encoded = tf.io.parse_example(batch, {features.IMAGE_KEY: tf.io.VarLenFeature(tf.string)})[features.IMAGE_KEY]
        pixels = tf.cast(self._loaded.image_pixels(features.to_dense(encoded)), tf.float32).numpy()
        # ONNX_CHUNK images a run: its memory arena grows to the largest run's activations
        return np.concatenate([self._onnx(pixels[i : i + ONNX_CHUNK]) for i in range(0, len(pixels), ONNX_CHUNK)])


def _on_onnx(loaded, name: str) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """The serving model's Keras model (pixel_probabilities) as an ONNX Runtime session, or None where TensorFlow
    runs it: a GPU or TPU, a model exported before pixel_probabilities, a conversion that fails."""
    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        return None
    traced = getattr(getattr(loaded, "pixel_probabilities", None), "concrete_functions", None)
    if not traced or not hasattr(loaded, "image_pixels"):
        return None
    try:
        frozen = convert_variables_to_constants_v2(traced[0])
        graph_def = frozen.graph.as_graph_def()
        return runtimes.onnx_session(runtimes.converted(graph_def, frozen.inputs[0].name, frozen.outputs[0].name))
    except Exception as e:  # noqa: BLE001 - tf2onnx and onnxruntime raise many types for an op they lack
        logging.warning("Evaluator: ONNX Runtime cannot run %s (%s); its serving model scores it", name, e)
        return None
    finally:
        give_back_freed_memory()  # what the conversion freed (0.27 of 0.38 GB it left behind, EfficientNet-Lite0)


def write_split(raw_files: List[str], out_file: str, served: Dict[str, Callable], labels: Labels) -> int:
    """One pass over a split's raw records: each compared model's probabilities (`served`: slot -> a batch of raw
    records -> their probabilities, a ServingPass) with each image's key and label, into out_file (gzip TFRecords);
    the images written."""
    spec = {
        keys.SHA256: tf.io.FixedLenFeature([], tf.string, default_value=""),
        labels.text_key: tf.io.VarLenFeature(tf.string),
    }
    batches = features.record_batches(raw_files, INFERENCE_BATCH)
    written = 0
    with tf.io.TFRecordWriter(out_file, options="GZIP") as writer:
        for batch in batches:
            parsed = tf.io.parse_example(batch, spec)
            names = tf.RaggedTensor.from_sparse(parsed[labels.text_key]).to_list()
            by_slot = {slot: probabilities_of(batch) for slot, probabilities_of in served.items()}
            for i, key in enumerate(parsed[keys.SHA256].numpy()):
                label_key, label = labels.feature(names[i])
                row = {features.KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[key])), label_key: label}
                for slot, probabilities in by_slot.items():
                    row[probabilities_key(slot)] = tf.train.Feature(
                        float_list=tf.train.FloatList(value=probabilities[i])
                    )
                writer.write(tf.train.Example(features=tf.train.Features(feature=row)).SerializeToString())
            written += len(names)
    return written


def _artifact_at(artifact, uri: str):
    """A copy of an input artifact (the same MLMD id and properties) pointing at `uri`."""
    copied = type(artifact.mlmd_artifact)()
    copied.CopyFrom(artifact.mlmd_artifact)
    moved = artifact_utils.deserialize_artifact(artifact.artifact_type, copied)
    moved.uri = uri
    return moved


def scored_on_predictions(
    input_dict, splits: List[str], evaluation_uri: str, infos: Dict[str, Dict[str, Any]], multi_label: bool, load
) -> Tuple[Dict[str, list], Dict[str, Any]]:
    """Writes the prediction records of `splits` and each compared model's reader; (the input_dict TFMA reads, what
    evaluated_on.json adds). `infos`: each compared model's model_info by input key; `load`: what loads each serving
    model."""
    started = time.monotonic()
    folder = os.path.join(evaluation_uri, PREDICTIONS_DIR)
    compared = {SLOTS[k]: input_dict[k][0] for k in SLOTS if input_dict.get(k)}
    names = infos[standard_component_specs.MODEL_KEY]["class_names"]
    served = {
        slot: ServingPass(load(path_utils.serving_model_path(model.uri)), f"the {slot}")
        for slot, model in compared.items()
    }
    examples = input_dict[standard_component_specs.EXAMPLES_KEY][0]
    images = {}
    for split in splits:
        raw = sorted(tf.io.gfile.glob(os.path.join(artifact_utils.get_split_uri([examples], split), "*")))
        out = os.path.join(folder, RECORDS_DIR, f"Split-{split}")
        tf.io.gfile.makedirs(out)
        images[split] = write_split(raw, os.path.join(out, RECORDS_FILE), served, Labels(names, multi_label))
    swapped = plain(input_dict)
    records = _artifact_at(examples, os.path.join(folder, RECORDS_DIR))
    records.split_names = artifact_utils.encode_split_names(list(splits))
    swapped[standard_component_specs.EXAMPLES_KEY] = [records]
    for key, slot in SLOTS.items():
        if slot in compared:
            module = ReaderModule(slot, len(names), multi_label)
            reader = os.path.join(folder, slot)
            tf.saved_model.save(
                module,
                path_utils.serving_model_path(reader),
                signatures={"serving_examples": module.serve_examples, "transform_features": module.transform_features},
            )
            swapped[key] = [_artifact_at(input_dict[key][0], reader)]
    seconds = time.monotonic() - started
    logging.info("Evaluator: %s prediction records of %s in %.1f s", sum(images.values()), ", ".join(compared), seconds)
    ran = {slot: {"runtime": p.runtime, "largest_difference": p.largest_difference} for slot, p in served.items()}
    return swapped, {
        "scored_from": "prediction records",
        "predictions": {"images": images, "seconds": round(seconds, 2), "models": ran},
    }


def prediction_scores(scored: Dict[str, list]) -> RecordScores:
    """The candidate's class and probability for eval images, by key, read from its prediction records (what TFMA
    scored): the look at eval images runs no model to classify them."""
    column = probabilities_key(SLOTS[standard_component_specs.MODEL_KEY])
    spec = {column: tf.io.VarLenFeature(tf.float32)}
    return RecordScores(
        scored[standard_component_specs.EXAMPLES_KEY][0].uri,
        lambda batch: tf.sparse.to_dense(tf.io.parse_example(batch, spec)[column]).numpy(),
    )
