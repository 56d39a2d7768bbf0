"""Transfer learning: imagepipe's default run (--model auto) against the plain Keras recipes, on photo-like sets.

    python -m bench.transfer_benchmark                                   # every set, seeds 1 and 2
    python -m bench.transfer_benchmark --sets defect-2 --seeds 1 --sizes 160,192,224 --no-baselines

Sets (made here, presplit, so every method trains and is scored on the same images):
  marked     photo crops of 192 px, the class a small pattern (36 px: checks, stripes or a ring) at a random
             place (bench/planted.py --scale 3): train 150, eval 50 of each class
  defect-2   bench/imbalanced.py: one scene kind, `ok` or `defect` (a small dark scratch or blotch), 160-240 px,
             train 1,600 ok + 32 defects (2%), eval 400 + 16
  longtail   bench/imbalanced.py: ten shapes on photos (96 px), train 800 down to 12 images a class, eval 40 each
For each set and seed:
  - `imagepipe run --data SET --seed S` in a fresh process and --root, every setting at its default (--sizes
    adds runs at each --image-size, to choose the default size by accuracy per second);
  - bench/plain_keras.py: the Keras tutorial CNN (12 epochs), and with the `class_weight` recipe;
  - bench/plain_keras_transfer.py: the Keras transfer-learning guide's recipe (frozen base + dense head, the
    base run on every image of every epoch) with the same EfficientNet-Lite0 weights, 10 epochs.
Balanced accuracy is the mean recall of the classes; seconds are wall time of each process (imagepipe's:
the whole pipeline, features and explanations included).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from bench import recipe_folders, run_recipe
from bench.imbalance_benchmark import IMAGEPIPE, run_plain, smallest_class
from bench.photo_benchmark import save_results

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "transfer")
SETS = ("marked", "defect-2", "longtail")


def make_marked(out: str, train: int = 150, evaluation: int = 50, scale: int = 3, seed: int = 0) -> str:
    """bench/planted.py's patch set at `scale`, presplit: <out>/{train,eval}/<class>/NNNNN.png."""
    import numpy as np
    from sklearn.datasets import load_sample_images

    from bench import planted
    from storage.user_files import write_folder

    def build(tmp: str) -> None:
        sources = load_sample_images().images
        for s, (split, count) in enumerate((("train", train), ("eval", evaluation))):
            for c, name in enumerate(planted.PATCH_CLASSES):
                os.makedirs(os.path.join(tmp, split, name))
                for n in range(count):
                    data, _ = planted.image("patch", name, np.random.default_rng([seed, s, c, n]), sources, scale)
                    with open(os.path.join(tmp, split, name, f"{n:05d}.png"), "wb") as f:
                        f.write(data)

    return write_folder(out, build, "--out")


def make_set(name: str) -> str:
    from bench.imbalanced import make_defect_set, make_longtail_set

    path = os.path.join(OUT, name)
    if name == "marked":
        return make_marked(path)
    if name == "defect-2":
        return make_defect_set(path, 1600, 32)
    return make_longtail_set(path, 800, 12, 40)


def run_imagepipe(data: str, seed: int, root: str, extra=()) -> dict:
    started = time.monotonic()
    proc = subprocess.run(
        [IMAGEPIPE, "run", "--data", data, "--root", root, "--seed", str(seed), "--progress", "json", *extra],
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    finished = next((e for e in events if e["event"] == "run_finished"), None)
    if (
        finished is None
        or finished["status"] == "failed"
        and "Evaluator" not in {c["component"] for c in finished["components"]}
    ):
        raise RuntimeError(f"imagepipe run failed:\n{proc.stderr[-3000:]}")
    parts = {c["component"]: c for c in finished["components"]}
    evaluation = parts["Evaluator"]["details"]
    trainer = parts["Trainer"]["details"]
    features = parts.get("BackboneFeatures")
    return {
        "accuracy": evaluation["accuracy"],
        "balanced_accuracy": evaluation["balanced_accuracy"],
        "recall": {name: m["recall"] for name, m in evaluation["per_class"].items()},
        "blessed": evaluation["blessed"],
        "seconds": seconds,
        "epochs": trainer["epochs"],
        "model": trainer.get("model"),
        "features_seconds": features["seconds"] if features else 0.0,
        "trainer_seconds": parts["Trainer"]["seconds"],
    }


def run_transfer_recipe(data: str, seed: int) -> dict:
    found = run_recipe("bench.plain_keras_transfer", *recipe_folders(data), "--seed", str(seed))
    return {**found, "blessed": None, "model": "efficientnet_lite0"}


def _table(results) -> None:
    print(
        "\n| set | method | balanced accuracy (mean, min-max) | weakest class recall | rarest class recall | "
        "largest class recall | blessed | seconds |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["set"] for r in results):
        for method in dict.fromkeys(r["method"] for r in results if r["set"] == name):
            rows = [r for r in results if r["set"] == name and r["method"] == method]
            balanced = [r["balanced_accuracy"] for r in rows]
            blessed = [r["blessed"] for r in rows if r["blessed"] is not None]
            print(
                f"| {name} | {method} | {statistics.mean(balanced):.3f} ({min(balanced):.3f}-{max(balanced):.3f}) | "
                f"{statistics.mean(min(r['recall'].values()) for r in rows):.2f} | "
                f"{statistics.mean(r['recall'].get(r['rare'], 0) for r in rows):.2f} | "
                f"{statistics.mean(r['recall'].get(r['common'], 0) for r in rows):.2f} | "
                f"{f'{sum(blessed)}/{len(blessed)}' if blessed else '-'} | "
                f"{statistics.mean(r['seconds'] for r in rows):.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--sizes", default="", help="also imagepipe runs at each --image-size (e.g. 160,192,224)")
    parser.add_argument("--no-baselines", action="store_true", help="imagepipe runs only")
    parser.add_argument("--no-default", action="store_true", help="no default imagepipe run (with --sizes)")
    parser.add_argument("--table", action="store_true", help="print the table of the saved results; run nothing")
    args = parser.parse_args()
    path = os.path.join(OUT, "results-sizes.json" if args.no_default else "results.json")
    if args.table:
        _table(json.load(open(path)))
        return
    results = []
    for name in args.sets.split(","):
        data = make_set(name)
        rare, train = smallest_class(data), os.path.join(data, "train")
        common = max(sorted(os.listdir(train)), key=lambda c: len(os.listdir(os.path.join(train, c))))
        for seed in map(int, args.seeds.split(",")):
            runs = {}
            variants = ([] if args.no_default else [("imagepipe, defaults", [])]) + [
                (f"imagepipe --image-size {size}", ["--image-size", size]) for size in args.sizes.split(",") if size
            ]
            for method, extra in variants:
                work = tempfile.mkdtemp(prefix=f"imagepipe-transfer-{name}-")
                try:
                    runs[method] = run_imagepipe(data, seed, os.path.join(work, "root"), extra)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            if not args.no_baselines:
                runs["plain Keras CNN"] = run_plain(data, seed, class_weight=False)
                runs["Keras class_weight recipe"] = run_plain(data, seed, class_weight=True)
                runs["Keras transfer recipe (same backbone)"] = run_transfer_recipe(data, seed)
            for method, r in runs.items():
                results.append({"set": name, "seed": seed, "method": method, "rare": rare, "common": common, **r})
                print(
                    f"{name} seed {seed} {method}: balanced {r['balanced_accuracy']:.4f}, accuracy "
                    f"{r['accuracy']:.4f}, {rare} recall {r['recall'].get(rare, 0):.2f}, worst "
                    f"{min(r['recall'].values()):.2f}, blessed {r['blessed']}, {r['seconds']:.0f} s"
                    + (f" ({r.get('model')}, features {r.get('features_seconds', 0):.0f} s)" if r.get("model") else ""),
                    flush=True,
                )
            save_results(results, path)
    _table(results)


if __name__ == "__main__":
    main()
