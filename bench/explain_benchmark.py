"""Explanations: which attribution method finds what decides the class, and what a map costs per image.

    python -m bench.explain_benchmark                       # the patch set, 200 images a class, every method
    python -m bench.explain_benchmark --per-class 100 --methods ig-blur

Trains imagepipe's default model on bench/planted.py's patch set (the class is a 12 px patch at a random place of a
64 px photo crop; `imagepipe run`, 30 epochs at most, --patience 10), then explains every third image with each method of
trainer/explain.py on the pushed model, and reports, over the images classified right: the median share of the map's
top pixels (as many as the patch has) inside the patch, the share of images where that is over half, the median
share of the whole map's mass inside the patch (the patch is 3.5% of the image), and milliseconds per image (one
process, 2 cores, batches of the explainer's own size).
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


def measure(data: str, model_dir: str, methods, count: int = 150) -> list:
    from trainer import explain

    boxes = json.load(open(os.path.join(data, "boxes.json")))
    explainer = explain.Explainer(model_dir)
    rels = sorted(boxes)[::3][:count]
    pixels = explainer.pixels([open(os.path.join(data, "images", r), "rb").read() for r in rels])
    explainer.explain(pixels[:8])  # warm-up: the first call traces
    rows = []
    for method in methods:
        started = time.perf_counter()
        maps, probabilities = explainer.explain(pixels, method=method)  # no targets: the probabilities come back
        ms = 1000 * (time.perf_counter() - started) / len(rels)
        right = [i for i, r in enumerate(rels) if explainer.class_names[probabilities[i].argmax()] == r.split("/")[0]]
        shares = [explain.top_share_inside(maps[i], boxes[rels[i]]) for i in right]
        mass = [
            float(maps[i][boxes[rels[i]][1] : boxes[rels[i]][3], boxes[rels[i]][0] : boxes[rels[i]][2]].sum())
            for i in right
        ]
        rows.append(
            {
                "method": method,
                "images": len(rels),
                "right": len(right),
                "top_share": float(np.median(shares)),
                "mostly_inside": float(np.mean([s > 0.5 for s in shares])),
                "mass_inside": float(np.median(mass)),
                "ms_per_image": ms,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=200)
    from trainer import explain

    parser.add_argument("--methods", default=",".join(explain.METHODS))
    args = parser.parse_args()
    from bench.planted import make_planted

    data = make_planted(os.path.join(OUT, f"patch-{args.per_class}"), "patch", args.per_class)
    with tempfile.TemporaryDirectory(prefix="imagepipe-explain-") as root:
        subprocess.run(
            [
                IMAGEPIPE,
                "run",
                "--data",
                os.path.join(data, "images"),
                "--root",
                root,
                "--epochs",
                "30",
                "--patience",
                "10",
                "--image-size",
                "64",
                "--accuracy-threshold",
                "0.5",
                "--explanations",
                "0",
            ],
            check=True,
            capture_output=True,
        )
        model = sorted(glob.glob(os.path.join(root, "serving", "*", "*")))[-1]
        rows = measure(data, model, args.methods.split(","))
    print(f"\n{explain.STEPS} steps a path; images classified right of those explained\n")
    print(
        "| method | right | top pixels inside the patch (median) | images mostly inside | map mass inside (median) "
        "| ms per image |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['method']} | {r['right']}/{r['images']} | {r['top_share']:.2f} | {r['mostly_inside']:.2f} | "
            f"{r['mass_inside']:.2f} | {r['ms_per_image']:.1f} |"
        )


if __name__ == "__main__":
    main()
