"""Explanations: which attribution method finds what decides the class, with how many steps, and what a map costs.

    python -m bench.explain_benchmark                       # the patch set, 200 images a class, every method
    python -m bench.explain_benchmark --model efficientnet_lite0 --per-class 150 --methods ig-blur \
        --steps 24,12,8,6 --count 90                        # the default backbone at 224 px

Trains a model on bench/planted.py's patch set (the class is a 12 px patch at a random place of a 64 px photo crop;
`imagepipe run`: the small CNN at 64 px, 30 epochs at most, --patience 10; or EfficientNet-Lite0 at 224 px), then
explains every third image with each method of trainer/explain.py and each step count on the pushed model, and
reports, over the images classified right: the median share of the map's top pixels (as many as the patch has) inside
the patch, the share of images where that is over half, the median share of the whole map's mass inside the patch
(the patch is 3.5% of the image), the maps' agreement with the first step count's (correlation, mean over the images),
and milliseconds per image (one process, 2 cores, batches of the explainer's own size). Then the Evaluator's own
explanation step on the run's eval split, with its defaults: seconds, records examined.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "explain")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


def measure(data: str, model_dir: str, methods, count: int = 150, steps=(8,)) -> list:
    """A row per method and step count: how much of each map lands on the patch, its agreement with the first step
    count's map (correlation, mean over the images), and the milliseconds an image."""
    from trainer import explain

    boxes = json.load(open(os.path.join(data, "boxes.json")))
    explainer = explain.Explainer(model_dir)
    rels = sorted(boxes)[::3][:count]
    pixels = explainer.pixels([open(os.path.join(data, "images", r), "rb").read() for r in rels])
    from PIL import Image

    # The boxes are in the images' own pixels; the model's input may be larger (a backbone's 224 px).
    scale = pixels.shape[1] / Image.open(os.path.join(data, "images", rels[0])).size[0]
    boxes = {r: [int(round(v * scale)) for v in boxes[r]] for r in rels}
    explainer.explain(pixels[:8])  # warm-up: the first call traces
    rows = []
    for method in methods:
        first = None
        for n in steps:
            started = time.perf_counter()
            maps, probabilities = explainer.explain(pixels, method=method, steps=n)  # the probabilities come back
            ms = 1000 * (time.perf_counter() - started) / len(rels)
            first = maps if first is None else first
            right = [
                i for i, r in enumerate(rels) if explainer.class_names[probabilities[i].argmax()] == r.split("/")[0]
            ]
            shares = [explain.top_share_inside(maps[i], boxes[rels[i]]) for i in right]
            mass = [
                float(maps[i][boxes[rels[i]][1] : boxes[rels[i]][3], boxes[rels[i]][0] : boxes[rels[i]][2]].sum())
                for i in right
            ]
            agreement = np.mean([np.corrcoef(maps[i].ravel(), first[i].ravel())[0, 1] for i in range(len(rels))])
            rows.append(
                {
                    "method": method,
                    "steps": n,
                    "images": len(rels),
                    "right": len(right),
                    "top_share": float(np.median(shares)),
                    "mostly_inside": float(np.mean([s > 0.5 for s in shares])),
                    "mass_inside": float(np.median(mass)),
                    "agreement": float(agreement),
                    "ms_per_image": ms,
                }
            )
    return rows


# How each model is trained on the patch set: the small CNN at the set's own 64 px, or the default backbone at its
# 224 px (its head on cached features; a low bar, so that it is pushed).
TRAINING = {
    "cnn": ["--epochs", "30", "--patience", "10", "--image-size", "64", "--accuracy-threshold", "0.5"],
    "efficientnet_lite0": ["--image-size", "224", "--accuracy-threshold", "0.3", "--min-class-recall", "0"],
}


def evaluator_step(root: str, model: str) -> dict:
    """The Evaluator's explanations as a run makes them (the default sample of the run's eval split): seconds,
    records examined, images explained."""
    from components.evaluator import explanations

    examples = sorted(glob.glob(os.path.join(root, "pipelines", "*", "ImageExampleGen", "examples", "*")))[-1]
    with tempfile.TemporaryDirectory(prefix="imagepipe-explained-") as out:
        index = explanations.explain_eval(model, examples, out, explanations.LIMIT)["explanations"]
    return {"seconds": index["seconds"], "examined": index["examined"], "images": len(index["images"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=200)
    from trainer import explain

    parser.add_argument("--methods", default=",".join(explain.METHODS))
    parser.add_argument("--model", choices=sorted(TRAINING), default="cnn")
    parser.add_argument(
        "--steps", default=f"24,{explain.STEPS}", help="path points, each count compared with the first"
    )
    parser.add_argument("--count", type=int, default=150, help="images explained (every third of the set)")
    args = parser.parse_args()
    from bench.planted import make_planted

    data = make_planted(os.path.join(OUT, f"patch-{args.per_class}"), "patch", args.per_class)
    with tempfile.TemporaryDirectory(prefix="imagepipe-explain-") as root:
        subprocess.run(
            [IMAGEPIPE, "run", "--data", os.path.join(data, "images"), "--root", root, "--model", args.model]
            + ["--auto-trial-minutes", "0", "--explanations", "0"]
            + TRAINING[args.model],
            check=True,
            capture_output=True,
        )
        model = sorted(glob.glob(os.path.join(root, "serving", "*", "*")))[-1]
        rows = measure(data, model, args.methods.split(","), args.count, [int(n) for n in args.steps.split(",")])
        step = evaluator_step(root, model)
    print(f"\n{args.model}; images classified right of those explained; agreement: with the first step count's maps\n")
    print(
        "| method | steps | right | top pixels inside the patch (median) | images mostly inside | "
        "map mass inside (median) | agreement | ms per image |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['method']} | {r['steps']} | {r['right']}/{r['images']} | {r['top_share']:.2f} | "
            f"{r['mostly_inside']:.2f} | {r['mass_inside']:.2f} | {r['agreement']:.2f} | {r['ms_per_image']:.1f} |"
        )
    print(
        f"\nThe Evaluator's explanations ({explain.STEPS} steps): {step['images']} images of {step['examined']} eval "
        f"records examined in {step['seconds']:.1f} s"
    )


if __name__ == "__main__":
    main()
