"""Where the model looked, for a bounded sample of eval images: what the Evaluator adds after TFMA for the report.

The sample: every misclassified eval image first (at most half of `limit`), then correctly classified ones, the
classes taken in turn, up to `limit` images in all, from the eval records in order, read until the sample is settled
(at most MAX_EXAMINED: each decoded once; only the pixels of the images the sample may take are kept while they are
read). Each image's map is integrated gradients for its predicted class on the exported model (trainer/explain.py):
explain.STEPS forward and backward passes of the model. Written to the evaluation's explanations/ folder:

  index.json          {"images": [{path, actual, predicted, probability, correct, overlay}], "classes": [{name,
                       images, overlay}], "method", "seconds", "examined", "limit"}
  NNNNN.png           each image's map over the image as the model saw it (grey)
  class-NNN.png       per predicted class, the mean map of its correctly classified images: "where the model looks"

The same pass records the first misclassified eval images for the report (misclassified.py), read on until that
record is settled too (at most MAX_EXAMINED records in all); with `limit` 0 it does only that. Each image's class is
the scored model's: where TFMA scored the head on the features step's features (on_features.py: it agrees with the
exported model within AGREEMENT_TOLERANCE), the head's on the image's feature record (on_features.HeadScores), and the
exported model runs only to explain (the Evaluator without explanations, 400 eval images at 224 px: 13.9 -> 8.7 s,
docs/benchmarks.md); else the exported model's.

A multi-label model's image is explained for its most likely label, correct when that label is one of its own.
"""

import io
import json
import os
import time
from typing import Any, Dict, List, NamedTuple

import numpy as np

from components.evaluator import Blessing
from components.evaluator import misclassified as eval_misclassified
from components.evaluator.results import INDEX_FILE, folder_index
from images import feature_keys as keys
from trainer import explain

EXPLANATIONS_DIR = "explanations"
MAX_EXAMINED = 2000  # eval records classified to find the sample (full-size photos: streamed, batch by batch)
LIMIT = Blessing.explanations  # images explained by default (--explanations; 0: none)
OVERLAY_SIZE = 128


def sample(rows: List[Dict[str, Any]], limit: int) -> List[int]:
    """Indices into `rows` ({correct, predicted}) to explain: misclassified first (at most half of limit), then
    correct ones class by class in turn (each class's first ones), `limit` in all."""
    wrong = [i for i, r in enumerate(rows) if not r["correct"]][: limit // 2 if limit > 1 else limit]
    by_class: Dict[str, List[int]] = {}
    for i, r in enumerate(rows):
        if r["correct"]:
            by_class.setdefault(r["predicted"], []).append(i)
    chosen, queues = list(wrong), [list(v) for _, v in sorted(by_class.items())]
    while len(chosen) < limit and any(queues):
        for q in queues:
            if q and len(chosen) < limit:
                chosen.append(q.pop(0))
    return chosen


def settled(wrong: int, right: Dict[str, int], limit: int, classes: List[str]) -> bool:
    """Whether rows read so far (`wrong` misclassified, `right` correct ones by predicted class) settle sample(): it
    takes the first misclassified ones (at most half) and then the first correct ones of each class in turn, so once
    the rows hold that many of each, the rows after them cannot change it, and need not be classified."""
    wanted_wrong = limit // 2 if limit > 1 else limit
    wanted_right = -(-(limit - wanted_wrong) // max(1, len(classes)))
    return wrong >= wanted_wrong and all(right.get(c, 0) >= wanted_right for c in classes)


def explain_eval(
    model_dir: str,
    examples_uri: str,
    evaluation_uri: str,
    limit: int,
    multi_label: bool = False,
    load=None,
    scores=None,
) -> Dict:
    """Explains up to `limit` eval images of `examples_uri` (ImageExampleGen's output) with the SavedModel at
    model_dir into the evaluation's explanations/ folder (nothing there when limit is 0), and records the first
    misclassified ones into its misclassified/ folder; returns {"explanations": index.json's dict or {},
    "misclassified": misclassified.py's index}. `load`: what loads the SavedModel (explain.Explainer). `scores`
    (on_features.HeadScores, when TFMA scored the head on the features): each image's class comes from it, and the
    SavedModel runs only for the explanations (and for an image without a feature record)."""
    # TensorFlow (~5 s): the run summary and the review page import this module, not to explain
    import tensorflow as tf

    started = time.monotonic()
    files = sorted(tf.io.gfile.glob(os.path.join(examples_uri, "Split-eval", "*")))  # local or gs://
    explainer = explain.Explainer(model_dir, load)
    read = _classify(explainer, files, limit, multi_label, scores)
    listed = eval_misclassified.write(
        read.misclassified,
        len(read.rows),
        read.reading_on,
        _made(os.path.join(evaluation_uri, eval_misclassified.MISCLASSIFIED_DIR)),
        _write,
    )
    if limit <= 0:
        return {"explanations": {}, "misclassified": listed}
    out_dir = _made(os.path.join(evaluation_uri, EXPLANATIONS_DIR))
    shown, per_class = _explain_chosen(explainer, read.rows, read.images, sample(read.rows, limit), out_dir)
    classes = _class_maps(per_class, out_dir)
    index = {
        "method": f"integrated gradients ({explain.METHOD}, {explain.STEPS} steps)",
        "images": shown,
        "classes": classes,
        "examined": read.sampled_from,
        "limit": limit,
        # what the explanations cost: the pass but its reading on for the misclassified record (misclassified.py)
        "seconds": round(time.monotonic() - started - read.reading_on, 2),
    }
    _write(os.path.join(out_dir, INDEX_FILE), json.dumps(index, indent=1).encode())
    return {"explanations": index, "misclassified": listed}


class _Classified(NamedTuple):
    rows: List[Dict[str, Any]]  # a row each, in record order
    images: Dict[int, np.ndarray]  # the pixels (as the model sees them) of the rows sample() may choose, by row
    misclassified: "eval_misclassified.Found"
    sampled_from: int  # the rows read when sample() was settled (every row when it never was)
    reading_on: float  # seconds spent reading on after that, for the misclassified record alone


def _classify(explainer, files: List[str], limit: int, multi_label: bool, scores=None) -> _Classified:
    """Eval records classified in order until sample() and the misclassified record are settled, MAX_EXAMINED at
    most: by `scores` (explain_eval), else by the SavedModel on their pixels."""
    # TensorFlow: as in explain_eval
    import tensorflow as tf

    # imports TensorFlow: as in explain_eval
    from trainer import features

    labels_key = keys.LABELS_TEXT if multi_label else keys.LABEL_TEXT
    spec = {
        keys.ENCODED: tf.io.FixedLenFeature([], tf.string),
        keys.FILENAME: tf.io.FixedLenFeature([], tf.string),
        keys.SHA256: tf.io.FixedLenFeature([], tf.string, default_value=""),
        labels_key: tf.io.VarLenFeature(tf.string),
    }
    rows, images, found = [], {}, eval_misclassified.Found()
    wrong, right, sampled_from, reading_on = 0, {}, None, 0.0
    records = features.record_batches(files, 64, most=MAX_EXAMINED)
    for batch in records:
        if settled(wrong, right, limit, explainer.class_names):
            sampled_from = len(rows) if sampled_from is None else sampled_from
            if found.settled():
                break
        batch_started = time.monotonic()
        parsed = tf.io.parse_example(batch, spec)
        encoded = parsed[keys.ENCODED].numpy()
        best = scores(parsed[keys.SHA256].numpy().tolist()) if scores else None
        # Pixels for the model, or for the sample while it is open (sample() takes none of the rows read on after it)
        pixels = explainer.pixels(list(encoded)) if best is None or sampled_from is None else None
        if best is None:
            probabilities = explainer.probabilities(pixels)
            best = zip(probabilities.argmax(axis=1).tolist(), probabilities.max(axis=1).tolist())
        actual = tf.RaggedTensor.from_sparse(parsed[labels_key]).to_list()
        for i, (class_id, probability) in enumerate(best):
            names = [n.decode("utf-8", "replace") for n in actual[i]]
            predicted = explainer.class_names[class_id]
            correct = predicted in names
            # Pixels only until the sample is settled: sample() takes none of the rows read on after it.
            if sampled_from is None and (
                (not correct and wrong < limit) or (correct and right.get(predicted, 0) < limit)
            ):
                images[len(rows)] = pixels[i]
                wrong += not correct
                right[predicted] = right.get(predicted, 0) + correct
            rows.append(
                {
                    "path": parsed[keys.FILENAME][i].numpy().decode("utf-8", "replace"),
                    "actual": ";".join(names),
                    "predicted": predicted,
                    "probability": round(probability, 6),
                    "correct": correct,
                    "id": class_id,
                }
            )
            found.add(rows[-1], encoded[i])
        if sampled_from is not None:
            reading_on += time.monotonic() - batch_started
    return _Classified(rows, images, found, len(rows) if sampled_from is None else sampled_from, reading_on)


def _explain_chosen(explainer, rows: List[Dict[str, Any]], images, chosen: List[int], out_dir: str):
    """Each chosen image's map written over it: (index.json's image entries, the correct ones' (image, map) by
    predicted class)."""
    shown, per_class = [], {}
    for start in range(0, len(chosen), 32):
        part = chosen[start : start + 32]
        chosen_pixels = np.stack([images[i] for i in part])
        maps, _ = explainer.explain(chosen_pixels, [rows[i]["id"] for i in part])
        for n, (i, image, attribution) in enumerate(zip(part, chosen_pixels, maps), start=start + 1):
            name = f"{n:05d}.png"
            _write(os.path.join(out_dir, name), explain.overlay_png(image, attribution, OVERLAY_SIZE))
            shown.append({**{k: v for k, v in rows[i].items() if k != "id"}, "overlay": name})
            if rows[i]["correct"]:
                per_class.setdefault(rows[i]["predicted"], []).append((image, attribution))
    return shown, per_class


def _class_maps(per_class: Dict[str, list], out_dir: str) -> List[Dict[str, Any]]:
    """Per predicted class, the mean map of its correctly classified images, over their mean image."""
    classes = []
    for c, (name, items) in enumerate(sorted(per_class.items())):
        average = explain.class_average([m for _, m in items])
        backdrop = np.mean(np.stack([image for image, _ in items]).astype(np.float32), axis=0)
        overlay = f"class-{c:03d}.png"
        _write(os.path.join(out_dir, overlay), explain.overlay_png(backdrop, average, OVERLAY_SIZE))
        saved = io.BytesIO()
        np.save(saved, average)
        _write(os.path.join(out_dir, f"class-{c:03d}.npy"), saved.getvalue())
        classes.append({"name": name, "images": len(items), "overlay": overlay, "map": f"class-{c:03d}.npy"})
    return classes


def _made(folder: str) -> str:
    # TensorFlow's gfile (local or gs://): as in explain_eval
    import tensorflow as tf

    tf.io.gfile.makedirs(folder)  # the evaluation artifact's folder
    return folder


def _write(path: str, data: bytes) -> None:
    # TensorFlow's gfile (local or gs://): as in explain_eval
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)


def read_index(evaluation_uri: str) -> Dict[str, Any]:
    """index.json of an evaluation's explanations (with "folder": where its images are), or {} when it has none
    (--explanations 0, an older run)."""
    return folder_index(evaluation_uri, EXPLANATIONS_DIR)
