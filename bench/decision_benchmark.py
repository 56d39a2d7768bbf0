"""Decisions on held-out train data: the default run on imbalanced photo sets against the anchors.

    python -m bench.decision_benchmark                          # both sets, seed 1
    python -m bench.decision_benchmark --baseline 619ec93       # and the commit before, side by side
    python -m bench.decision_benchmark --table                  # the saved results' table

Sets (presplit, made here with no network, from two source photos: scikit-learn's sample images):
  rare-1  `china` crops: train ok 1,500 + defect 32 (2.1%), eval ok 375 + defect 16 (bench/imbalanced.py's
          scratches and blotches)
  rare-3  `flower` crops: train ok 1,500 + scratch 40, blotch 32, spot 24 (1.5-2.5% each), eval ok 375 + 20, 16, 12
Methods, each scored on the same eval images:
  - imagepipe, defaults (`imagepipe run --data SET --seed S`): the Trainer's model scored on the eval images
    through its serving signature (so with its operating point and temperature), whether the Evaluator blessed
    it, and beside it the Trainer's own held-out figures: the optimism of a figure chosen on what grades it shows
    as the gap;
  - the same at --baseline REV (a git worktree of that commit, run with this environment);
  - the Keras `class_weight` recipe (bench/plain_keras.py --class-weight: the tutorial CNN, 12 epochs);
  - a careful practitioner's probe on the same EfficientNet-Lite0 pooled features: scikit-learn's
    LogisticRegression (standardised features, class_weight="balanced"), at its argmax, and with per-class offsets
    tuned on 5-fold out-of-fold predictions of the train split for the gate's asks (accuracy 0.9, every class's
    recall 0.5; trainer/operating_point.search_offsets), then refitted on the whole train split.
Per method: each rare class's recall, the common class's, balanced accuracy, the expected calibration error of the
top probability (15 bins), blessed (imagepipe), seconds (wall time; imagepipe's: the whole pipeline).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

from bench.imbalance_benchmark import IMAGEPIPE, run_plain
from bench.photo_benchmark import save_results

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "decisions")
SETS = ("rare-1", "rare-3")
COMMON = "ok"
ASKED_ACCURACY, ASKED_RECALL = 0.9, 0.5  # the gate's defaults
SCORING_BATCH = 64


def _kind_defect(kind: str, image, rng) -> None:
    """A defect of one kind on `image`: a dark scratch, a dark blotch, or a bright spot (1-3% of the image)."""
    from PIL import ImageDraw

    side = image.size[0]
    area = rng.uniform(0.01, 0.03) * side * side
    cx, cy = rng.uniform(0.15 * side, 0.85 * side, size=2)
    draw = ImageDraw.Draw(image)
    if kind == "scratch":
        width = max(2, int(0.025 * side))
        length, angle = area / width, rng.uniform(0, np.pi)
        dx, dy = np.cos(angle) * length / 2, np.sin(angle) * length / 2
        draw.line((cx - dx, cy - dy, cx + dx, cy + dy), fill=tuple(int(v) for v in rng.integers(0, 40, 3)), width=width)
        return
    r = np.sqrt(area / np.pi)
    shade = tuple(int(v) for v in (rng.integers(0, 40, 3) if kind == "blotch" else rng.integers(225, 256, 3)))
    draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=shade)


def make_set(name: str) -> str:
    from sklearn.datasets import load_sample_images

    from bench import imbalanced

    china, flower = load_sample_images().images
    path = os.path.join(OUT, name)
    if name == "rare-1":
        counts = {"train": {COMMON: 1500, "defect": 32}, "eval": {COMMON: 375, "defect": 16}}

        def make(label, rng):
            return imbalanced.defect_image(label == "defect", rng, [china])

    else:
        counts = {
            "train": {COMMON: 1500, "scratch": 40, "blotch": 32, "spot": 24},
            "eval": {COMMON: 375, "scratch": 20, "blotch": 16, "spot": 12},
        }

        def make(label, rng):
            image = imbalanced._scene(rng, [flower])
            if label != COMMON:
                _kind_defect(label, image, rng)
            return imbalanced._jpeg(image, rng)

    return imbalanced._write_set(path, counts, make, seed=0)


def _images(data: str, split: str):
    """(encoded bytes, labels as names) of a split, in name order."""
    folder = os.path.join(data, split)
    images, labels = [], []
    for label in sorted(os.listdir(folder)):
        for name in sorted(os.listdir(os.path.join(folder, label))):
            with open(os.path.join(folder, label, name), "rb") as f:
                images.append(f.read())
            labels.append(label)
    return images, labels


def _figures(probabilities: np.ndarray, labels: List[str], class_names: List[str]) -> Dict:
    from trainer import operating_point

    ids = np.array([class_names.index(label) for label in labels])
    found = operating_point.figures(ids, probabilities.argmax(1), len(class_names))
    return {
        "recall": dict(zip(class_names, found["recall"])),
        "balanced_accuracy": found["balanced_accuracy"],
        "accuracy": found["accuracy"],
        "ece": operating_point.expected_calibration_error(probabilities, ids),
    }


def run_imagepipe(data: str, seed: int, root: str, checkout: str = "") -> Dict:
    """A default run (of `checkout`'s code when given), its model scored on the eval images."""
    import tensorflow as tf

    env = dict(os.environ, PYTHONPATH=checkout) if checkout else None
    started = time.monotonic()
    proc = subprocess.run(
        [IMAGEPIPE, "run", "--data", data, "--root", root, "--seed", str(seed), "--progress", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout or None,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    finished = next((e for e in events if e["event"] == "run_finished"), None)
    parts = {c["component"]: c for c in (finished or {}).get("components", [])}
    if "Evaluator" not in parts:
        raise RuntimeError(f"imagepipe run failed:\n{proc.stderr[-3000:]}")
    trainer = parts["Trainer"]["details"]
    model_run = trainer["model_run"]
    model = os.path.join(os.path.dirname(os.path.dirname(model_run)), "model", os.path.basename(model_run))
    served = tf.saved_model.load(os.path.join(model, "Format-Serving")).signatures["serving_default"]
    images, labels = _images(data, "eval")
    probabilities = np.concatenate(
        [
            served(image_bytes=tf.constant(images[i : i + SCORING_BATCH]))["probabilities"].numpy()
            for i in range(0, len(images), SCORING_BATCH)
        ]
    )
    held = (trainer.get("operating_point") or {}).get("held_out")
    return {
        **_figures(probabilities, labels, trainer["class_names"]),
        "held_out_balanced_accuracy": held["chosen"]["balanced_accuracy"] if held else None,
        "held_out_recall": dict(zip(trainer["class_names"], held["chosen"]["recall"])) if held else None,
        "blessed": parts["Evaluator"]["details"]["blessed"],
        "model": trainer.get("model"),
        "seconds": seconds,
    }


def _lite0_features(images: List[bytes]) -> np.ndarray:
    """The pooled EfficientNet-Lite0 features of the images, decoded and resized as the pipeline does."""
    import tensorflow as tf

    from images import decoding
    from trainer import models
    from trainer.hparams import HParams

    hp = HParams(model="efficientnet_lite0", image_size=224)
    extractor = models.feature_extractor(hp, models.make_backbone(hp))
    dataset = (
        tf.data.Dataset.from_tensor_slices(images)
        .map(lambda e: tf.cast(decoding.decode_and_resize(e, 224, 3), tf.float32))
        .batch(32)
    )
    return np.concatenate([extractor(x, training=False).numpy() for x in dataset])


def run_probe(data: str, seed: int) -> Dict[str, Dict]:
    """The logistic-regression probe on Lite0 features: at argmax, and with offsets tuned on out-of-fold
    predictions."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from trainer import operating_point

    started = time.monotonic()
    train_images, train_labels = _images(data, "train")
    eval_images, eval_labels = _images(data, "eval")
    class_names = sorted(set(train_labels))
    x_train, x_eval = _lite0_features(train_images), _lite0_features(eval_images)
    y = np.array([class_names.index(label) for label in train_labels])
    probe = make_pipeline(
        StandardScaler(), LogisticRegression(C=0.1, class_weight="balanced", max_iter=5000, random_state=seed)
    )
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    out_of_fold = cross_val_predict(probe, x_train, y, cv=folds, method="predict_proba")
    floors = np.full(len(class_names), ASKED_RECALL)
    offsets = operating_point.search_offsets(operating_point.log_probabilities(out_of_fold), y, floors, ASKED_ACCURACY)
    probe.fit(x_train, y)
    probabilities = probe.predict_proba(x_eval)
    seconds = time.monotonic() - started
    tuned = operating_point.softmax(operating_point.log_probabilities(probabilities) + offsets)
    return {
        "logistic-regression probe, argmax": {
            **_figures(probabilities, eval_labels, class_names),
            "seconds": seconds,
            "blessed": None,
        },
        "logistic-regression probe, tuned offsets": {
            **_figures(tuned, eval_labels, class_names),
            "seconds": seconds,
            "blessed": None,
        },
    }


def _worktree(revision: str) -> str:
    path = os.path.join(OUT, f"baseline-{revision}")
    if not os.path.exists(path):
        subprocess.run(["git", "worktree", "add", "--detach", path, revision], check=True, capture_output=True)
    return path


def _table(results) -> None:
    print(
        "\n| set | method | rare classes' recall (each) | ok recall | balanced accuracy | held-out balanced "
        "(the Trainer's) | ECE | blessed | seconds |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["set"] for r in results):
        for method in dict.fromkeys(r["method"] for r in results if r["set"] == name):
            rows = [r for r in results if r["set"] == name and r["method"] == method]
            rare = sorted(c for c in rows[0]["recall"] if c != COMMON)
            held = [r["held_out_balanced_accuracy"] for r in rows if r.get("held_out_balanced_accuracy") is not None]
            blessed = [r["blessed"] for r in rows if r.get("blessed") is not None]
            print(
                f"| {name} | {method} | "
                + ", ".join(f"{c} {statistics.mean(r['recall'][c] for r in rows):.2f}" for c in rare)
                + f" | {statistics.mean(r['recall'][COMMON] for r in rows):.3f}"
                f" | {statistics.mean(r['balanced_accuracy'] for r in rows):.3f}"
                f" | {f'{statistics.mean(held):.3f}' if held else '-'}"
                f" | {statistics.mean(r['ece'] for r in rows):.3f}"
                f" | {f'{sum(blessed)}/{len(blessed)}' if blessed else '-'}"
                f" | {statistics.mean(r['seconds'] for r in rows):.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--baseline", default="", help="also the default run at this git revision")
    parser.add_argument("--no-anchors", action="store_true", help="imagepipe runs only")
    parser.add_argument("--table", action="store_true", help="print the saved results' table; run nothing")
    args = parser.parse_args()
    path = os.path.join(OUT, "results.json")
    if args.table:
        _table(json.load(open(path)))
        return
    results = []
    for name in args.sets.split(","):
        data = make_set(name)
        for seed in map(int, args.seeds.split(",")):
            runs = {}
            checkouts = [("imagepipe, defaults", "")]
            if args.baseline:
                checkouts.append((f"imagepipe at {args.baseline}", _worktree(args.baseline)))
            for method, checkout in checkouts:
                work = tempfile.mkdtemp(prefix=f"imagepipe-decisions-{name}-")
                try:
                    runs[method] = run_imagepipe(data, seed, os.path.join(work, "root"), checkout)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            if not args.no_anchors:
                plain = run_plain(data, seed, class_weight=True)
                runs["Keras class_weight recipe"] = {**plain, "ece": plain.get("ece", float("nan"))}
                runs.update(run_probe(data, seed))
            for method, r in runs.items():
                results.append({"set": name, "seed": seed, "method": method, **r})
                print(
                    f"{name} seed {seed} {method}: balanced {r['balanced_accuracy']:.3f}, recall "
                    + ", ".join(f"{c} {v:.2f}" for c, v in sorted(r["recall"].items()) if v is not None)
                    + f", blessed {r.get('blessed')}, {r['seconds']:.0f} s",
                    flush=True,
                )
            save_results(results, path)
    _table(results)


if __name__ == "__main__":
    sys.exit(main())
