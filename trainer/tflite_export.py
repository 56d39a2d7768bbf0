"""On-device export: the trained model as TensorFlow Lite, inside the SavedModel folder it ships with.

    <serving model>/tflite/model_float16.tflite  float16 weights: half the size, float maths
    <serving model>/tflite/model_int8.tflite     int8 weights and activations, calibrated on a sample
                                                 of the training split
    <serving model>/tflite/labels.txt            the class names, one per line, in output order

Each takes what a mobile app holds: uint8 RGB (or grey) pixels [1, size, size, channels], the
image already resized to the model's input size (images/decoding.decode_and_resize is how
training did it), and gives class probabilities [batch, classes]. Pusher copies the folder, so the
files travel with every pushed model. Each is scored on the held-out train images (up to EVAL_LIMIT;
trainer/holdout.py: the Trainer never reads the eval split) next to the Keras model the SavedModel serves, on the
same examples; training.json keeps the figures.

The Trainer runs all this in a child process (`python -m trainer.tflite_export JOB RESULT`) from the
weights it saved: the converter writes C++ log lines straight to stderr, and on some graphs aborts the
process it runs in; either way the Trainer's own process, and its output, are untouched.
"""

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, Iterable, List, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from trainer import features, input_pipeline, model_exports, models
from trainer.holdout import Holdout, Part
from trainer.hparams import TFLITE_KINDS, HParams

TFLITE_DIR = "tflite"
LABELS_FILE = "labels.txt"
EVAL_LIMIT = 2000  # held-out examples scored per model: enough for a +-1 point comparison, bounded time
SCORING_BATCH = 64  # images in memory at once while scoring (2,000 at 224 px, float32, are 1.2 GB)
CALIBRATION_SAMPLES = 200  # training images the int8 converter measures activation ranges on


def file_name(kind: str) -> str:
    return f"model_{kind}.tflite"


class TFLiteClassifier:
    """A .tflite classifier: uint8 pixels [n, size, size, channels] -> probabilities [n, classes].

    The models take one image per call, as apps call them; a fixed shape also lets TFLite's default
    CPU delegate (XNNPACK) take the whole graph.
    """

    def __init__(self, content: bytes):
        self._interpreter = interpreter(content)
        self._interpreter.allocate_tensors()
        self._input = self._interpreter.get_input_details()[0]
        self._output = self._interpreter.get_output_details()[0]
        _, self.image_size, _, self.channels = (int(d) for d in self._input["shape"])

    def probabilities(self, pixels: np.ndarray) -> np.ndarray:
        scale, zero_point = self._output["quantization"]
        rows = []
        for image in _quantize(pixels, self._input):
            self._interpreter.set_tensor(self._input["index"], image[np.newaxis])
            self._interpreter.invoke()
            rows.append(self._interpreter.get_tensor(self._output["index"])[0].astype(np.float32))
        out = np.stack(rows) if rows else np.zeros((0, 0), np.float32)
        return (out - zero_point) * scale if scale else out


def interpreter(content: bytes):
    """A TFLite interpreter of the model: LiteRT's (ai-edge-litert, in the lock: tf.lite.Interpreter is deprecated
    from TF 2.19), or TensorFlow's where LiteRT is not installed."""
    try:
        from ai_edge_litert.interpreter import Interpreter  # optional: without LiteRT, TensorFlow's (below)
    except ImportError:
        Interpreter = tf.lite.Interpreter
    return Interpreter(model_content=content, num_threads=os.cpu_count())


def _quantize(pixels: np.ndarray, detail: Dict) -> np.ndarray:
    """Pixel values 0..255 as the input tensor wants them (an int8 model's input carries a scale)."""
    scale, zero_point = detail["quantization"]
    if not scale:
        return pixels.astype(detail["dtype"])
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(pixels.astype(np.float32) / scale + zero_point), info.min, info.max).astype(detail["dtype"])


def export(
    model, hp: HParams, class_names: List[str], train_files: List[str], scored: Part, serving_model_dir: str
) -> Dict:
    """Writes the hp.tflite_kinds models and labels; returns what training.json records about them."""
    folder = os.path.join(serving_model_dir, TFLITE_DIR)
    tf.io.gfile.makedirs(folder)
    with tf.io.gfile.GFile(os.path.join(folder, LABELS_FILE), "w") as f:
        f.write("".join(name + "\n" for name in class_names))
    written = {}
    for kind in hp.tflite_kinds:
        content = convert(model, hp, kind, train_files)
        with tf.io.gfile.GFile(os.path.join(folder, file_name(kind)), "wb") as f:
            f.write(content)
        written[kind] = content
    multi_hot = len(class_names) if models.is_multi_label(model) else 0
    scores = score(
        model,
        {kind: TFLiteClassifier(content) for kind, content in written.items()},
        lambda: first_scored_batches(train_files, scored, hp, multi_hot),
        hp,
    )
    return {
        "scored_on": "held-out",  # the held-out train images (before them: the eval split)
        "examples": scores.pop("examples"),
        "savedmodel_accuracy": scores.pop("keras"),
        "models": {
            kind: {"file": f"{TFLITE_DIR}/{file_name(kind)}", "accuracy": scores[kind], "bytes": len(content)}
            for kind, content in written.items()
        },
    }


def convert(model, hp: HParams, kind: str, train_files: List[str]) -> bytes:
    """The model as TFLite bytes; float16 takes uint8 pixels through a cast, int8 quantizes its input.

    The converter gets a frozen function (variables as constants): given a Keras 3 model's variables
    (TF 2.16), it aborts the whole process ("missing attribute 'value'", tensorflow#65012).
    """
    assert kind in TFLITE_KINDS, kind
    dtype = tf.uint8 if kind == "float16" else tf.float32
    spec = tf.TensorSpec([1, hp.image_size, hp.image_size, hp.channels], dtype, name="pixels")
    classify = tf.function(
        lambda pixels: {"probabilities": model(tf.cast(pixels, tf.float32), training=False)}, input_signature=[spec]
    )
    frozen = convert_variables_to_constants_v2(classify.get_concrete_function())
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind == "float16":
        converter.target_spec.supported_types = [tf.float16]
    else:
        # multi-label records parse only with a multi_hot (any count will do: the labels are not used)
        multi_hot = 1 if models.is_multi_label(model) else 0
        converter.representative_dataset = lambda: _calibration(train_files, hp, multi_hot)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.uint8  # pixels as the app has them; the output stays float
    return converter.convert()


def _calibration(train_files: List[str], hp: HParams, multi_hot: int) -> Iterable[List[np.ndarray]]:
    dataset = input_pipeline.make_dataset(
        train_files, hp, training=False, batching=input_pipeline.Batching(1, multi_hot=multi_hot)
    )
    for images, _ in dataset.take(CALIBRATION_SAMPLES):
        yield [images.numpy()]


def _correct(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Examples right: the top class is the label; multi-label (multi-hot labels), the share of an image's labels
    the probabilities get right at 0.5 (binary accuracy), summed over the images."""
    if labels.ndim == 2:
        return float(((probabilities > 0.5) == (labels > 0.5)).mean(axis=1).sum())
    return float((probabilities.argmax(1) == labels).sum())


def score(model, classifiers: Dict[str, TFLiteClassifier], batches, hp: HParams) -> Dict:
    """Accuracy (multi-label: binary accuracy at 0.5) of the Keras model and of each TFLite model on the same
    examples, batches() of them (first_scored_batches: the first EVAL_LIMIT held-out train images)."""
    correct = {name: 0.0 for name in ["keras", *classifiers]}
    seen = 0
    for images, labels in batches():
        correct["keras"] += _correct(model.predict_on_batch(images), labels)  # traced (eager calls held GBs at 224 px)
        pixels = images.astype(np.uint8)  # already whole numbers 0..255 (Transform stored uint8)
        for name, classifier in classifiers.items():
            correct[name] += _correct(classifier.probabilities(pixels), labels)
        seen += len(labels)
    return {"examples": seen, **{name: round(n / max(seen, 1), 4) for name, n in correct.items()}}


class TFLiteExportError(RuntimeError):
    """The child process that converts and scores the TFLite models failed; the message is one line."""


def export_in_child(
    hp: HParams,
    num_classes: int,
    class_names: List[str],
    weights_file: str,
    train_files: List[str],
    scored: Part,
    serving_model_dir: str,
    multi_label: bool = False,
) -> Dict:
    """main() in a fresh process, from the saved weights: {"tflite": ..., "exports": ...}, or TFLiteExportError.
    The exports are scored on the `scored` part of the train split (its held-out images: trainer/holdout.py)."""
    job = {
        "hparams": hp.to_custom_config(),
        "num_classes": num_classes,
        "class_names": class_names,
        "multi_label": multi_label,
        "weights_file": weights_file,
        "train_files": train_files,
        "holdout": scored.holdout.to_json(),
        "held": scored.held,
        "serving_model_dir": serving_model_dir,
    }
    with tempfile.TemporaryDirectory(prefix="imagepipe-tflite-") as folder:
        job_file, result_file = os.path.join(folder, "job.json"), os.path.join(folder, "result.json")
        with open(job_file, "w") as f:
            json.dump(job, f)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        done = subprocess.run(
            [sys.executable, "-m", __name__, job_file, result_file],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            raise TFLiteExportError(f"exit status {done.returncode}: {(lines or ['no output'])[-1][:300]}")
        with open(result_file) as f:
            return json.load(f)


def main(job_file: str, result_file: str) -> None:
    """The child's work: the TFLite models (--tflite), then the other runtimes' exports (--exports:
    trainer/model_exports.py), from the saved weights; {"tflite": record, "exports": record}."""
    with open(job_file) as f:
        job = json.load(f)
    hp = HParams.from_custom_config(job["hparams"])
    multi_label = job.get("multi_label", False)
    model = models.build(hp, job["num_classes"], multi_label=multi_label)
    with models.local_file(job["weights_file"]) as local:
        model.load_weights(local)
    record = {}
    scored = Part(Holdout.from_json(job["holdout"]), job["held"])
    if hp.tflite_kinds:
        record["tflite"] = export(model, hp, job["class_names"], job["train_files"], scored, job["serving_model_dir"])
    if hp.export_kinds:
        record["exports"] = model_exports.export(
            model,
            hp.image_size,
            hp.channels,
            job["class_names"],
            hp.export_kinds,
            job["serving_model_dir"],
            lambda: first_scored_batches(job["train_files"], scored, hp, len(job["class_names"]) if multi_label else 0),
            multi_label,
        )
    with open(result_file, "w") as f:
        json.dump(record, f)


def first_scored_batches(
    train_files: List[str], scored: Part, hp: HParams, multi_hot: int = 0
) -> Iterable[Tuple[np.ndarray, np.ndarray]]:
    """(images float32 0..255, labels) of the first EVAL_LIMIT held-out train examples, SCORING_BATCH at a time:
    what every export is scored on. Read straight from the records (no count of the whole split first, nothing
    cached), one batch in memory at a time."""
    files = input_pipeline.list_files(train_files)
    records = scored.keep(tf.data.TFRecordDataset(files, compression_type=features.compression(files))).take(EVAL_LIMIT)
    for batch in records.batch(SCORING_BATCH):
        images, labels = input_pipeline.parse_batch(batch, hp, multi_hot)
        yield images.numpy(), labels.numpy()


if __name__ == "__main__":
    main(*sys.argv[1:3])
