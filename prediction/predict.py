"""Classifies image files with an exported model: what `imagepipe predict` runs (its inputs:
image_inputs.py; its result files: result_files.py).

The model is the SavedModel the Trainer exported (Pusher copies blessed ones to
<root>/serving/<name>/<version>/); its serving_default signature takes raw
encoded image bytes. Files that are not decodable images get a per-file error,
checked with the same rules as ingestion, and the others still get answers.
"""

import json
import os
import queue
import threading
from typing import Dict, Iterable, Iterator, List, Tuple, Union

import numpy as np

from components.evaluator.views import given_a_class
from components.model_card import THRESHOLD_FILE
from components.pusher import complete_version
from images.bounds import MAX_PIXELS
from prediction.image_inputs import Input, byte_batches, inspect_input
from storage import files as fs
from storage.errors import DataError
from trainer.artifact_files import INFO_FILE, KERAS_DIR
from trainer.explain import Explainer, ExplanationsUnavailable


class ModelNotFound(FileNotFoundError):
    """No SavedModel where one was expected; the message says where to look."""


class ModelUnusable(ValueError):
    """A SavedModel that TensorFlow cannot load (or without the serving signature); one line."""


def load_serving(model_dir: str):
    """The model's serving_default signature (or a .tflite model behind the same call), or ModelUnusable
    naming the folder and the fix."""
    import tensorflow as tf  # TensorFlow (~4 s): only once a model loads, after the inputs and outputs are checked

    try:
        if model_dir.endswith(".tflite"):
            return TFLiteServing(model_dir)
        return tf.saved_model.load(model_dir).signatures["serving_default"]
    except Exception as e:  # noqa: BLE001 - TensorFlow raises many types for a damaged model
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        kind = "TFLite model" if model_dir.endswith(".tflite") else "SavedModel"
        raise ModelUnusable(
            f"--model {model_dir}: not a usable {kind} ({type(e).__name__}: {first}); "
            "give a model the pipeline pushed (<root>/serving/<name>) or run 'imagepipe run' "
            "again"
        ) from None


class TFLiteServing:
    """A TFLite export (trainer/tflite_export.py) called like serving_default: encoded images in, the
    same outputs out. Images are decoded and resized by the function training used, then given to the
    model as the uint8 pixels an app would pass; class names come from labels.txt beside the file."""

    def __init__(self, path: str):
        import tensorflow as tf  # TensorFlow (~4 s): only once a model loads (see load_serving)

        # these import TensorFlow too
        from images.decoding import decode_and_resize
        from trainer.tflite_export import LABELS_FILE, TFLiteClassifier

        labels = fs.join(os.path.dirname(path), LABELS_FILE)
        if not tf.io.gfile.exists(labels):
            raise FileNotFoundError(f"no {LABELS_FILE} beside it")
        with tf.io.gfile.GFile(labels) as f:
            self._names = [line.rstrip("\n") for line in f if line.strip()]
        with tf.io.gfile.GFile(path, "rb") as f:
            self._model = TFLiteClassifier(f.read())
        self._decode = decode_and_resize

    def __call__(self, image_bytes):
        import tensorflow as tf  # not at this module's import (see load_serving); loaded with the model

        size, channels = self._model.image_size, self._model.channels
        pixels = np.stack([self._decode(encoded, size, channels).numpy() for encoded in image_bytes])
        probabilities = self._model.probabilities(pixels)
        return {
            "probabilities": tf.constant(probabilities),
            "class_names": tf.constant([[n.encode() for n in self._names]] * len(pixels)),
        }


def resolve_model_dir(path: str) -> str:
    """A SavedModel folder, a .tflite file, or a Pusher destination holding numbered SavedModel versions
    (the newest complete one wins: components/pusher); local or gs://."""
    if fs.is_remote(path):
        import tensorflow as tf  # TensorFlow (~4 s): only a gs:// model needs its file system

        try:
            fs.check_reachable(path)
        except DataError as e:
            raise ModelNotFound(f"--model {e}") from None
        exists, isdir, listdir = tf.io.gfile.exists, tf.io.gfile.isdir, tf.io.gfile.listdir
    else:
        exists, isdir, listdir = os.path.exists, os.path.isdir, os.listdir
    if exists(fs.join(path, "saved_model.pb")) or (path.endswith(".tflite") and exists(path)):
        return path
    if isdir(path):
        # The newest whole version: one cut short (a Pusher killed mid-copy) is never served.
        versions = sorted((v.rstrip("/") for v in listdir(path) if v.rstrip("/").isdigit()), key=int, reverse=True)
        complete = next((v for v in versions if complete_version(fs.join(path, v), exists)), None)
        if complete:
            return fs.join(path, complete)
    raise ModelNotFound(
        f"--model {path}: no SavedModel there (nor numbered versions of one, nor a .tflite file); "
        "give a pushed model folder such as .imagepipe/serving/imagepipe, or run 'imagepipe run' first"
    )


EVERY_CLASS = 0  # label_batch(top=EVERY_CLASS): every class, best first (the AutoML output lists them all)
# A single-label model's confidence threshold, or a multi-label model's threshold per label (threshold.json).
Threshold = Union[float, Dict[str, float]]


def is_multi_label(threshold: Threshold) -> bool:
    return isinstance(threshold, dict)


def label_batch(serve, images: List[bytes], top: int, threshold: Threshold = 0.0) -> List[Dict]:
    """{'predictions': [(class, probability), ...], 'ids': [class id, ...], 'unsure'} per image, best first,
    or {'error'} for an image TensorFlow cannot decode (it passed Pillow's checks); such an image makes the
    batch fail, so the batch is then served one image at a time and only that image gets the error.
    'unsure': the best probability is at or below the model's confidence threshold (model_threshold(); TFMA's
    rule, evaluation_views.given_a_class). A multi-label model (threshold: one per label) adds 'labels': every
    label whose probability is above its own threshold, best first, with 'label_ids' (none: no label applies;
    never 'unsure')."""
    import tensorflow as tf  # not at this module's import (see load_serving); loaded with the model

    try:
        out = serve(image_bytes=tf.constant(images))
    except tf.errors.InvalidArgumentError as e:
        if len(images) == 1:
            return [{"error": f"undecodable: {(e.message or type(e).__name__).splitlines()[0][:200]}"}]
        return [row for image in images for row in label_batch(serve, [image], top, threshold)]
    probabilities = out["probabilities"].numpy()
    names = [n.decode() for n in out["class_names"].numpy()[0]]
    found = []
    for row in probabilities:
        ranked = row.argsort()[::-1]
        best = ranked[: top or len(names)]
        result = {"predictions": [(names[j], float(row[j])) for j in best], "ids": [int(j) for j in best]}
        if is_multi_label(threshold):
            applying = [j for j in ranked if given_a_class(row[j], threshold.get(names[j], 0.5))]
            result.update(
                labels=[(names[j], float(row[j])) for j in applying], label_ids=[int(j) for j in applying], unsure=False
            )
        else:
            result["unsure"] = not given_a_class(row[best[0]], threshold)
        found.append(result)
    return found


def model_threshold(model_dir: str) -> Tuple[Threshold, str]:
    """(the confidence threshold that goes with a pushed model, how it was chosen): threshold.json beside the
    SavedModel (components/model_card), which for a .tflite file of the pushed version's tflite/ folder is one
    folder up; (0, "none") for a model without one (every image gets a class). A multi-label model's: its
    threshold per label ({label: threshold})."""
    folders = [model_dir]
    if model_dir.endswith(".tflite"):
        folders = [os.path.dirname(model_dir), os.path.dirname(os.path.dirname(model_dir))]
    for folder in folders:
        try:
            found = json.loads(fs.read_bytes(fs.join(folder, THRESHOLD_FILE)))
            if found.get("task") == "multi":
                return {str(k): float(v) for k, v in (found.get("thresholds") or {}).items()}, str(
                    found.get("how") or ""
                )
            return float(found.get("threshold") or 0.0), str(found.get("how") or "")
        except Exception:  # noqa: BLE001 - missing, unreadable (a remote store's own errors) or not JSON: none
            continue
    # A Trainer's own export (<model>/Format-Serving, never pushed) has no threshold.json; a multi-label one still
    # lists labels, each at 0.5, from the model_info.json beside it.
    try:
        info = json.loads(fs.read_bytes(fs.join(os.path.dirname(model_dir.rstrip("/")), KERAS_DIR, INFO_FILE)))
        if info.get("task") == "multi":
            return {str(name): 0.5 for name in info.get("class_names") or []}, "none chosen: 0.5 for every label"
    except Exception:  # noqa: BLE001 - as above: no record, single-label
        pass
    return 0.0, "none"


def classify(
    model_dir: str,
    inputs: Iterable[Input],
    top: int = 1,
    max_pixels: int = MAX_PIXELS,
    threshold: Threshold = 0.0,
    explain: bool = False,
) -> Iterator[Dict]:
    """One result per input, in order, as they are ready: {'path', 'predictions': [(class, probability)...],
    'ids', 'unsure'} or {'path', 'error'}; with `explain`, also 'pixels' (what the model saw) and 'attribution'
    (its map for the top class: trainer/explain.py).

    Streams: files are read as their batch fills (at most BATCH_BYTES of encoded images, 64 files),
    so memory does not grow with the number of inputs. The model is loaded at the first readable image.
    """
    serve = explainer = None
    inspected = (inspect_input(item, max_pixels) for item in inputs)
    batches = byte_batches(inspected, size=lambda result: len(result.get("data", b"")))
    for window in read_ahead(batches):
        images = [result for result in window if "data" in result]
        if images:
            if explain and explainer is None:  # one load: its serving signature classifies too
                explainer = explainer_for(model_dir)
                serve = explainer.serving
            serve = serve or load_serving(resolve_model_dir(model_dir))
            data = [r.pop("data") for r in images]
            for result, labels in zip(images, label_batch(serve, data, top, threshold)):
                result.update(labels)
            if explain:
                explained(
                    explainer,
                    [r for r in images if "error" not in r],
                    [d for r, d in zip(images, data) if "error" not in r],
                )
        yield from window


def explainer_for(model_dir: str):
    """An Explainer (trainer/explain.py) of a SavedModel; ModelUnusable for a TFLite file or an older export."""
    resolved = resolve_model_dir(model_dir)
    if resolved.endswith(".tflite"):
        raise ModelUnusable(
            f"--model {model_dir}: --explain needs the SavedModel (its gradients); give the pushed "
            "model folder, not its .tflite file"
        )
    try:
        return Explainer(resolved)
    except ExplanationsUnavailable as e:
        raise ModelUnusable(str(e)) from None


def explained(explainer, results: List[Dict], data: List[bytes]) -> None:
    """Adds 'pixels' and 'attribution' (the map of each result's top class) to classified results."""
    if not results:
        return
    pixels = explainer.pixels(data)
    maps, _ = explainer.explain(pixels, [r["ids"][0] for r in results])
    for result, image, attribution in zip(results, pixels, maps):
        result.update(pixels=image, attribution=attribution)


def read_ahead(batches: Iterable[List]) -> Iterator[List]:
    """The batches, with the next one read (and checked) in a thread while the caller serves this one.

    Reading and Pillow's checks are one core's work and the model's call mostly another's; at most three
    batches (3 x BATCH_BYTES) are held. An exception in the reader is raised here, at the batch it stopped.
    """
    ready: "queue.Queue" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer is gone

    def read():
        try:
            for batch in batches:
                if not offer(("batch", batch)):
                    return
            offer(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            offer(("error", e))

    reader = threading.Thread(target=read, name="predict-read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            kind, item = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (an error, Ctrl-C): the reader ends at its next batch
