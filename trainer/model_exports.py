"""Exports where users deploy beside TensorFlow: ONNX (checked with onnxruntime) and Core ML.

    <serving model>/onnx/model.onnx            float32 RGB pixels 0..255 [batch, size, size, 3] -> probabilities
                                               [batch, classes]; metadata: class_names (JSON), image_size, input
    <serving model>/coreml/model.mlpackage     Core ML ML program: an RGB image of size x size (pixels 0..255, as
                                               Core ML's image inputs give them) -> classLabel and classLabel_probs
                                               (multi-label: the probabilities, the labels in the metadata)

Like the TFLite models (trainer/tflite_export.py), they take the image already decoded and resized to the model's
input, as AutoML's edge exports do (images/decoding.decode_and_resize is how training resized); the scaling to
the backbone's range is inside. Both are made from the same frozen graph of the Keras model (pixels to
probabilities). ONNX is scored on the held-out train images (trainer/holdout.py) next to the Keras model (top-1 agreement and the largest
difference of a probability); Core ML cannot run on Linux, so what can be checked is: the spec's input (an image
of the right size), its outputs and its class labels, read back from the saved package. A format that cannot be
made for a model is one line naming it (`ExportError`), in the Trainer's record and from `imagepipe export`.
"""

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

EXPORT_KINDS = ("onnx", "coreml")
ONNX_FILE = os.path.join("onnx", "model.onnx")
COREML_PACKAGE = os.path.join("coreml", "model.mlpackage")
ONNX_OPSET = 17
INPUT = "pixels"  # the input's name in both formats
PRODUCER = "imagepipe"  # the ONNX model's producer, the Core ML package's "producer" metadata


class ExportError(RuntimeError):
    """A format that cannot be made for this model; one line naming it."""


def frozen_classifier(probabilities, image_size: int, channels: int, batch: Optional[int] = None):
    """The concrete function `probabilities` (float32 pixels [batch, size, size, channels] in 0..255 -> probabilities)
    with its variables as constants: what the converters take."""
    import tensorflow as tf  # TensorFlow (~4 s): the CLI imports this module at start-up
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    spec = tf.TensorSpec([batch, image_size, image_size, channels], tf.float32, name=INPUT)
    traced = tf.function(lambda pixels: probabilities(pixels), input_signature=[spec]).get_concrete_function()
    return convert_variables_to_constants_v2(traced)


def of_keras(model, image_size: int, channels: int, batch: Optional[int] = None):
    import tensorflow as tf  # TensorFlow (~4 s): the CLI imports this module at start-up

    return frozen_classifier(
        lambda pixels: tf.cast(model(pixels, training=False), tf.float32), image_size, channels, batch
    )


def of_saved_model(model_dir: str, batch: Optional[int] = None):
    """(frozen classifier, image size, channels, class names) of an exported model (trainer/export.py): its
    pixel_probabilities function and class names."""
    import tensorflow as tf  # TensorFlow (~4 s): the CLI imports this module at start-up

    loaded = tf.saved_model.load(model_dir)
    if not hasattr(loaded, "pixel_probabilities") or not hasattr(loaded, "class_names"):
        raise ExportError(
            "the model has no pixel classifier to export (a model exported before "
            "imagepipe kept one); train it again with this version"
        )
    (spec,), _ = loaded.pixel_probabilities.concrete_functions[0].structured_input_signature
    _, size, _, channels = spec.shape.as_list()
    names = [n.decode() for n in np.asarray(loaded.class_names.numpy()).reshape(-1)]
    return of_function(loaded.pixel_probabilities, size, channels, batch), size, channels, names


def of_function(function, image_size: int, channels: int, batch: Optional[int] = None):
    return frozen_classifier(function, image_size, channels, batch)


def onnx_bytes(frozen, image_size: int, class_names: Sequence[str], multi_label: bool) -> bytes:
    """The frozen classifier as an ONNX model, its class names and input described in its metadata."""
    try:
        import tf2onnx  # loads TensorFlow: only the ONNX export needs it

        (pixels,) = [t.name for t in frozen.inputs]
        model_proto, _ = tf2onnx.convert.from_graph_def(
            frozen.graph.as_graph_def(),
            input_names=[pixels],
            output_names=[t.name for t in frozen.outputs],
            opset=ONNX_OPSET,
            tensors_to_rename={pixels: INPUT},
        )
        _check_loads(model_proto)
    except Exception as e:  # noqa: BLE001 - tf2onnx raises many types for an op it lacks
        raise ExportError(
            f"onnx: the model cannot be converted ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"
        ) from None
    model_proto.producer_name = PRODUCER  # near the file's start: how `imagepipe export` knows a file as its own
    for key, value in (
        ("class_names", json.dumps(list(class_names))),
        ("image_size", str(image_size)),
        ("task", "multi" if multi_label else "single"),
        ("input", f"float32 RGB pixels 0..255 [batch, {image_size}, {image_size}, 3], resized"),
    ):
        entry = model_proto.metadata_props.add()
        entry.key, entry.value = key, value
    return model_proto.SerializeToString()


def _check_loads(model_proto) -> None:
    """tf2onnx logs an op it cannot map and goes on, leaving a model onnxruntime refuses: load it here, so that
    is this format's one-line error, not a file that cannot run."""
    import onnxruntime  # only the ONNX export needs it (the CLI imports this module at start-up)

    onnxruntime.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


# Images an onnxruntime call: one call holds every image and its activations (2,000 at 224 px are 1.2 GB of
# input alone).
SCORING_BATCH = 64


class OnnxClassifier:
    """An ONNX export run by onnxruntime: float32 pixels [n, size, size, channels] -> probabilities [n, classes]."""

    def __init__(self, content: bytes):
        import onnxruntime  # only scoring an ONNX export needs it (the CLI imports this module at start-up)

        self._session = onnxruntime.InferenceSession(content, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        meta = self._session.get_modelmeta().custom_metadata_map
        self.class_names: List[str] = json.loads(meta.get("class_names", "[]"))

    def probabilities(self, pixels: np.ndarray) -> np.ndarray:
        """Probabilities of every image, SCORING_BATCH images a call (memory bounded by the batch, not by n)."""
        parts = [
            self._session.run(None, {self._input: pixels[i : i + SCORING_BATCH].astype(np.float32)})[0]
            for i in range(0, len(pixels), SCORING_BATCH)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.class_names)), np.float32)


def write_coreml(frozen_one, image_size: int, class_names: Sequence[str], multi_label: bool, path: str) -> None:
    """The frozen classifier (batch 1) as a Core ML package at `path`, a new folder (`imagepipe export` writes it
    into a folder of its own that replaces only what it wrote: cli/export.py)."""
    try:
        import coremltools as ct  # loads TensorFlow: only the Core ML export needs it

        classifier = None if multi_label else ct.ClassifierConfig(list(class_names))
        model = ct.convert(
            [frozen_one],
            source="tensorflow",
            convert_to="mlprogram",
            inputs=[ct.ImageType(name=INPUT, shape=(1, image_size, image_size, 3), color_layout=ct.colorlayout.RGB)],
            classifier_config=classifier,
            minimum_deployment_target=ct.target.iOS15,
        )
    except Exception as e:  # noqa: BLE001 - coremltools raises many types for an op it lacks
        raise ExportError(
            f"coreml: the model cannot be converted ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"
        ) from None
    model.short_description = "imagepipe image classifier"
    model.user_defined_metadata["class_names"] = json.dumps(list(class_names))
    model.user_defined_metadata["producer"] = PRODUCER
    model.user_defined_metadata["task"] = "multi" if multi_label else "single"
    model.input_description[INPUT] = f"RGB image resized to {image_size}x{image_size}"
    model.save(path)


def describe_coreml(path: str) -> Dict:
    """What the saved package's spec says: its input (kind, size, colour), outputs and class names."""
    import coremltools as ct  # loads TensorFlow: only reading a Core ML export needs it

    spec = ct.utils.load_spec(path)
    (first,) = spec.description.input
    image = first.type.imageType
    return {
        "input": {
            "name": first.name,
            "image": first.type.WhichOneof("Type") == "imageType",
            "width": int(image.width),
            "height": int(image.height),
            "color": ct.proto.FeatureTypes_pb2.ImageFeatureType.ColorSpace.Name(image.colorSpace),
        },
        "outputs": [o.name for o in spec.description.output],
        "class_names": json.loads(spec.description.metadata.userDefined.get("class_names", "[]")),
        "producer": spec.description.metadata.userDefined.get("producer", ""),
        "type": spec.WhichOneof("Type"),
    }


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def export(
    model,
    image_size: int,
    channels: int,
    class_names: Sequence[str],
    kinds: Sequence[str],
    serving_model_dir: str,
    eval_batches: Callable[[], Iterable[Tuple[np.ndarray, Any]]],
    multi_label: bool = False,
) -> Dict:
    """Writes the `kinds` exports of the Keras model beside its SavedModel; returns training.json's record: each
    export's file, size and input, ONNX's agreement with the Keras model on the images of `eval_batches()` (batches
    of (pixels, labels), one in memory at a time: top-1, and the largest difference of a probability), Core ML's spec
    as read back; or a format's {"error"}."""
    from tfx.utils import io_utils  # TFX's file system: the serving model may be on gs://

    record: Dict[str, Dict] = {}
    if channels != 3:
        return {kind: {"error": f"{kind}: exported for 3-channel (RGB) models only"} for kind in kinds}
    for kind in kinds:
        try:
            if kind == "onnx":
                content = onnx_bytes(of_keras(model, image_size, channels), image_size, class_names, multi_label)
                io_utils.write_bytes_file(os.path.join(serving_model_dir, ONNX_FILE), content)  # local or gs://
                onnx = OnnxClassifier(content)
                compared = Agreement(multi_label)
                for pixels, _ in eval_batches():  # traced batches (eager calls held GBs at 224 px: task.py)
                    compared.add(model.predict_on_batch(pixels), onnx.probabilities(pixels))
                record[kind] = {
                    "file": ONNX_FILE,
                    "bytes": len(content),
                    "format": f"ONNX (opset {ONNX_OPSET})",
                    "input": f"float32 RGB pixels 0..255 [batch, {image_size}, {image_size}, 3]",
                    **compared.record(),
                }
            elif kind == "coreml":
                local = tempfile.mkdtemp(
                    prefix="imagepipe-coreml-"
                )  # made here, then copied (the model may be on gs://)
                try:
                    path = os.path.join(local, os.path.basename(COREML_PACKAGE))
                    write_coreml(
                        of_keras(model, image_size, channels, batch=1), image_size, class_names, multi_label, path
                    )
                    record[kind] = {
                        "file": COREML_PACKAGE,
                        "bytes": _folder_bytes(path),
                        "format": "Core ML ML program (iOS 15+, macOS 12+)",
                        "input": f"RGB image {image_size}x{image_size}",
                        "spec": describe_coreml(path),
                        "checked": "its spec (Core ML runs on Apple's systems only)",
                    }
                    io_utils.copy_dir(path, os.path.join(serving_model_dir, COREML_PACKAGE))
                finally:
                    shutil.rmtree(local, ignore_errors=True)
        except ExportError as e:
            record[kind] = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - one format failing must not lose the others' records
            record[kind] = {"error": f"{kind}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
    return record


class Agreement:
    """How an export agrees with the Keras model, batch by batch: the share of images whose top class (multi-label:
    every label at 0.5) is the same, and the largest difference of a probability."""

    def __init__(self, multi_label: bool = False):
        self.multi_label, self.examples, self.same, self.max_difference = multi_label, 0, 0, 0.0

    def add(self, expected: np.ndarray, got: np.ndarray) -> None:
        same = (
            ((got > 0.5) == (expected > 0.5)).all(axis=1) if self.multi_label else got.argmax(1) == expected.argmax(1)
        )
        self.examples += len(expected)
        self.same += int(same.sum())
        if len(expected):
            self.max_difference = max(self.max_difference, float(np.abs(got - expected).max()))

    def record(self) -> Dict:
        if not self.examples:
            return {"examples": 0, "agreement": None, "max_difference": None}
        return {
            "scored_on": "held-out",  # the held-out train images (before them: the eval split)
            "examples": self.examples,
            "agreement": round(self.same / self.examples, 6),
            "agreement_on": "every label at 0.5" if self.multi_label else "top-1",
            "max_difference": self.max_difference,
        }
