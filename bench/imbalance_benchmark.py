"""Imbalanced classes: imagepipe's defaults against the plain Keras script and the Keras `class_weight` recipe.

    python -m bench.imbalance_benchmark                                  # every set, seeds 1, 2, 3
    python -m bench.imbalance_benchmark --sets defect-2 --seeds 1 --variants default,off,sampling

Sets (bench/imbalanced.py, presplit, so every method trains and is scored on the same images):
  defect-2   `ok` and `defect` (a small dark scratch or blotch) photo-like JPEGs: train 1,600 ok + 32 defects
             (2%), eval 400 + 16
  defect-10  the same with 178 defects in train (10%), eval 400 + 89
  longtail   ten shapes (bench/shapes.py), train 800 down to 12 images a class, eval 40 of each
For each set and seed:
  - `imagepipe run --data SET --seed S` in a fresh process and --root, every setting at its default (a variant
    adds `--class-balance V`): the Evaluator's accuracy, balanced accuracy and per-class recall, and whether the
    model was blessed;
  - bench/plain_keras.py (image_dataset_from_directory, the same CNN, 12 epochs), and the same with the Keras
    imbalanced-classification recipe (`class_weight` = n / (k * count)).
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

from bench import recipe_folders, run_recipe
from bench.photo_benchmark import save_results

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "imbalance")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")
SETS = ("defect-2", "defect-10", "longtail")


def make_set(name: str) -> str:
    from bench.imbalanced import make_defect_set, make_longtail_set

    path = os.path.join(OUT, name)
    if name == "defect-2":
        return make_defect_set(path, 1600, 32)
    if name == "defect-10":
        return make_defect_set(path, 1600, 178)
    return make_longtail_set(path, 800, 12, 40)


def run_imagepipe(data: str, seed: int, root: str, variant: str) -> dict:
    extra = [] if variant == "default" else ["--class-balance", variant]
    started = time.monotonic()
    proc = subprocess.run(
        [IMAGEPIPE, "run", "--data", data, "--root", root, "--seed", str(seed), "--progress", "json", *extra],
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    finished = next((e for e in events if e["event"] == "run_finished"), None)
    if finished is None:
        raise RuntimeError(f"imagepipe run failed:\n{proc.stderr[-3000:]}")
    parts = {c["component"]: c for c in finished["components"]}
    evaluation = parts["Evaluator"]["details"]
    return {
        "accuracy": evaluation["accuracy"],
        "balanced_accuracy": evaluation["balanced_accuracy"],
        "recall": {name: m["recall"] for name, m in evaluation["per_class"].items()},
        "blessed": evaluation["blessed"],
        "seconds": seconds,
        "epochs": parts["Trainer"]["details"]["epochs"],
    }


def run_plain(data: str, seed: int, class_weight: bool) -> dict:
    weighed = ["--class-weight"] if class_weight else []
    return {**run_recipe("bench.plain_keras", *recipe_folders(data), "--seed", str(seed), *weighed), "blessed": None}


def smallest_class(data: str) -> str:
    train = os.path.join(data, "train")
    return min(sorted(os.listdir(train)), key=lambda c: len(os.listdir(os.path.join(train, c))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--variants", default="default", help="imagepipe runs: default, or --class-balance values")
    parser.add_argument("--no-baselines", action="store_true", help="imagepipe runs only")
    args = parser.parse_args()
    results = []
    for name in args.sets.split(","):
        data = make_set(name)
        rare = smallest_class(data)
        for seed in map(int, args.seeds.split(",")):
            runs = {}
            for variant in args.variants.split(","):
                work = tempfile.mkdtemp(prefix=f"imagepipe-imbalance-{name}-")
                try:
                    runs[f"imagepipe {variant}"] = run_imagepipe(data, seed, os.path.join(work, "root"), variant)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            if not args.no_baselines:
                runs["plain Keras"] = run_plain(data, seed, class_weight=False)
                runs["Keras class_weight"] = run_plain(data, seed, class_weight=True)
            for method, r in runs.items():
                results.append({"set": name, "seed": seed, "method": method, "rare": rare, **r})
                print(
                    f"{name} seed {seed} {method}: balanced {r['balanced_accuracy']:.4f}, accuracy "
                    f"{r['accuracy']:.4f}, {rare} recall {r['recall'].get(rare, 0):.2f}, worst "
                    f"{min(r['recall'].values()):.2f}, blessed {r['blessed']}, {r['seconds']:.0f} s",
                    flush=True,
                )
    save_results(results, os.path.join(OUT, "results.json"))
    print(
        "\n| set | method | balanced accuracy (mean, min-max) | accuracy | rarest class recall | worst class recall "
        "| blessed | seconds |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.sets.split(","):
        for method in dict.fromkeys(r["method"] for r in results if r["set"] == name):
            rows = [r for r in results if r["set"] == name and r["method"] == method]
            balanced = [r["balanced_accuracy"] for r in rows]
            blessed = [r["blessed"] for r in rows if r["blessed"] is not None]
            print(
                f"| {name} | {method} | {statistics.mean(balanced):.3f} ({min(balanced):.3f}-{max(balanced):.3f}) | "
                f"{statistics.mean(r['accuracy'] for r in rows):.3f} | "
                f"{statistics.mean(r['recall'].get(r['rare'], 0) for r in rows):.2f} | "
                f"{statistics.mean(min(r['recall'].values()) for r in rows):.2f} | "
                f"{f'{sum(blessed)}/{len(blessed)}' if blessed else '-'} | "
                f"{statistics.mean(r['seconds'] for r in rows):.0f} |"
            )


if __name__ == "__main__":
    main()
