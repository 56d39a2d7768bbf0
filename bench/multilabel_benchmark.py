"""Multi-label: imagepipe against the plain Keras multi-label script on the same images and split.

    python -m bench.multilabel_benchmark                      # 2,000 images of planted shapes, seeds 1, 2
    python -m bench.multilabel_benchmark --images 1000 --seeds 1 --epochs 20

The set is bench/multilabel.py's: photo backgrounds with 0 to 3 of five shapes (the rarest, 'star', in about one
image in ten), split TRAINING / VALIDATION / TEST in the manifest, so both methods train on the same train rows and
are scored on the same eval rows. For each seed:
  - `imagepipe run --data <set>/labels.csv --seed S --epochs E --image-size 96` in a fresh process and --root: the
    Evaluator's macro AUC-PR (TFMA), each label's F1 at its own threshold (best F1 on eval, the default) and at 0.5,
    and whether the model was blessed (every label's recall at its threshold at least --min-class-recall);
  - bench/plain_keras_multilabel.py: the same CNN with a sigmoid output and binary cross-entropy, E epochs, each
    label at 0.5, macro AUC-PR as scikit-learn's average precision.
Seconds are wall time of each process (imagepipe's: the whole pipeline).
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

from bench import run_recipe
from bench.photo_benchmark import save_results

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "multilabel")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


def run_imagepipe(data: str, seed: int, epochs: int, root: str) -> dict:
    started = time.monotonic()
    proc = subprocess.run(
        [
            IMAGEPIPE,
            "run",
            "--data",
            os.path.join(data, "labels.csv"),
            "--root",
            root,
            "--seed",
            str(seed),
            "--epochs",
            str(epochs),
            "--image-size",
            "96",
            "--progress",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    finished = next((e for e in events if e["event"] == "run_finished"), None)
    if finished is None:
        raise RuntimeError(f"imagepipe run failed:\n{proc.stderr[-3000:]}")
    evaluation = {c["component"]: c for c in finished["components"]}["Evaluator"]
    with open(os.path.join(evaluation["outputs"]["evaluation"][0], "views.json")) as f:
        views = json.load(f)
    at_half = {}
    for name, label in views["labels"].items():
        point = min(label["curve"], key=lambda p: abs(p["threshold"] - 0.5))
        at_half[name] = point["f1"] or 0.0
    per_label = views["at_threshold"]["per_class"]
    return {
        "macro_auc_pr": views["at_threshold"]["macro_auc_pr"],
        "f1": {name: m["f1"] or 0.0 for name, m in per_label.items()},
        "macro_f1": views["at_threshold"]["macro_f1"],
        "f1_at_half": at_half,
        "macro_f1_at_half": statistics.mean(at_half.values()),
        "blessed": evaluation["details"]["blessed"],
        "seconds": seconds,
    }


def run_plain(data: str, seed: int, epochs: int) -> dict:
    started = time.monotonic()  # the process's whole time, as imagepipe's runs are timed here
    found = run_recipe("bench.plain_keras_multilabel", "--data", data, "--seed", str(seed), "--epochs", str(epochs))
    return {
        **found,
        "f1_at_half": found["f1"],
        "macro_f1_at_half": found["macro_f1"],
        "blessed": None,
        "seconds": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    from bench.multilabel import LABELS, make_multilabel

    data = make_multilabel(os.path.join(OUT, f"shapes-{args.images}"), args.images)
    results = []
    for seed in map(int, args.seeds.split(",")):
        work = tempfile.mkdtemp(prefix="imagepipe-multilabel-")
        try:
            runs = {
                "imagepipe": run_imagepipe(data, seed, args.epochs, os.path.join(work, "root")),
                "plain Keras": run_plain(data, seed, args.epochs),
            }
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for method, r in runs.items():
            results.append({"seed": seed, "method": method, **r})
            print(
                f"seed {seed} {method}: macro AUC-PR {r['macro_auc_pr']:.4f}, macro F1 {r['macro_f1']:.4f} "
                f"(at 0.5: {r['macro_f1_at_half']:.4f}), F1 "
                + ", ".join(f"{n} {r['f1'].get(n, 0):.2f}" for n in LABELS)
                + f", blessed {r['blessed']}, {r['seconds']:.0f} s",
                flush=True,
            )
    save_results(results, os.path.join(OUT, "results.json"))
    print(
        "\n| method | macro AUC-PR (mean, min-max) | macro F1 | macro F1 at 0.5 | "
        + " | ".join(f"F1 {n}" for n in LABELS)
        + " | blessed | seconds |"
    )
    print("|---|---:|---:|---:|" + "---:|" * len(LABELS) + "---:|---:|")
    for method in dict.fromkeys(r["method"] for r in results):
        rows = [r for r in results if r["method"] == method]
        areas = [r["macro_auc_pr"] for r in rows]
        blessed = [r["blessed"] for r in rows if r["blessed"] is not None]
        print(
            f"| {method} | {statistics.mean(areas):.3f} ({min(areas):.3f}-{max(areas):.3f}) | "
            f"{statistics.mean(r['macro_f1'] for r in rows):.3f} | "
            f"{statistics.mean(r['macro_f1_at_half'] for r in rows):.3f} | "
            + " | ".join(f"{statistics.mean(r['f1'].get(n, 0) for r in rows):.2f}" for n in LABELS)
            + f" | {f'{sum(blessed)}/{len(blessed)}' if blessed else '-'} | "
            f"{statistics.mean(r['seconds'] for r in rows):.0f} |"
        )


if __name__ == "__main__":
    main()
