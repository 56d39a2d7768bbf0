"""The review loop's worth: a run on a set with planted label flips, one review of its top suspects, and the run
after it, each model scored on a clean held-out set.

    python -m bench.review_benchmark                      # 2,000 photo-like images, 15% of labels flipped
    python -m bench.review_benchmark --table              # the saved results' table

The set is bench/scale_set.py's photo-like images (10 classes, 160-320 px JPEGs: the default run takes the
pretrained backbone): the first `--images` are the data, 15% of them moved to another class's folder (each
--seeds value draws other flips of the same images),
and the next `--test` images a clean test set no run sees. Run 1: `imagepipe run` with its defaults (the label
check on the backbone's features; --gate warn, so the flips do not stop it). The review: the first 2x(flips)
rows of its label_issues.csv, decided as a careful reviewer would from the truth (a flipped image relabelled to
its true class, any other kept), written with storage/review_file.py as `imagepipe review` writes them. Run 2:
the same with --review (another --name: no baseline to beat, so each run's model is pushed and scored). Each
model classifies the test set with `imagepipe predict`: accuracy, balanced accuracy and the lowest class recall.
"""

import argparse
import collections
import csv
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import time

from bench.photo_benchmark import save_results
from bench.scale_set import CLASSES, make_scale_set

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out", "review")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


def _imagepipe(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([IMAGEPIPE, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"imagepipe {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done


def plant(source: str, out: str, images: int, test: int, share: float, seed: int):
    """(data folder, test folder, {flipped rel path: true class}) under `out`."""
    files = sorted(os.path.relpath(p, source) for p in glob.glob(os.path.join(source, "*", "*.jpg")))
    files.sort(key=lambda p: os.path.basename(p))  # the set's order: image number
    data, held = files[:images], files[images : images + test]
    rng = random.Random(seed)
    flipped = set(rng.sample(range(len(data)), int(share * len(data))))
    truth = {}
    for n, rel in enumerate(data):
        label, name = rel.split(os.sep)
        given = rng.choice([c for c in CLASSES if c != label]) if n in flipped else label
        os.makedirs(os.path.join(out, "data", given), exist_ok=True)
        shutil.copy(os.path.join(source, rel), os.path.join(out, "data", given, name))
        if n in flipped:
            truth[f"{given}/{name}"] = label
    for rel in held:
        os.makedirs(os.path.join(out, "test", os.path.dirname(rel)), exist_ok=True)
        shutil.copy(os.path.join(source, rel), os.path.join(out, "test", rel))
    return os.path.join(out, "data"), os.path.join(out, "test"), truth


def review(suspects_csv: str, truth: dict, first: int, path: str) -> dict:
    """The reviewer's decisions on the first `first` suspects, from the truth; what they were."""
    from storage import review_file

    rows = list(csv.DictReader(open(suspects_csv, newline="")))[:first]
    log = review_file.Log(path)
    counts = collections.Counter()
    for row in rows:
        true = truth.get(row["path"])
        action = "relabel" if true else "keep"
        log.append(
            review_file.Decision(
                review_file.now(), row["key"], row["path"], action, row["given"], true or "", "likely label error"
            )
        )
        counts[action] += 1
    log.close()
    return {"reviewed": len(rows), **counts}


def score(root: str, name: str, test: str) -> dict:
    """Accuracy, balanced accuracy and the lowest class recall of the pipeline's pushed model on the test set."""
    out = os.path.join(root, f"{name}-test.jsonl")
    _imagepipe("predict", "--root", root, "--name", name, "--output", out, test)
    right, seen = collections.Counter(), collections.Counter()
    for line in open(out):
        record = json.loads(line)
        actual = os.path.basename(os.path.dirname(record["path"]))
        seen[actual] += 1
        right[actual] += record["predictions"][0]["class"] == actual
    recalls = {c: right[c] / seen[c] for c in seen}
    return {
        "accuracy": round(sum(right.values()) / sum(seen.values()), 4),
        "balanced_accuracy": round(sum(recalls.values()) / len(recalls), 4),
        "lowest_class_recall": round(min(recalls.values()), 4),
        "lowest_class": min(recalls, key=recalls.get),
    }


def run(images: int, test: int, share: float, seed: int) -> dict:
    work = os.path.join(OUT, f"set-{images}-{seed}")
    shutil.rmtree(work, ignore_errors=True)
    source = make_scale_set(os.path.join(OUT, f"source-{images + test}"), images + test)  # one set; seeds: the flips
    data, held, truth = plant(source, work, images, test, share, seed)
    root = os.path.join(work, "root")
    common = ["run", "--root", root, "--data", data, "--gate", "warn", "--accuracy-threshold", "0"]
    started = time.monotonic()
    _imagepipe(*common, "--name", "before")
    first_seconds = time.monotonic() - started
    [suspects] = glob.glob(os.path.join(root, "pipelines", "before", "DataHealth", "health", "*", "label_issues.csv"))
    decided = review(suspects, truth, 2 * len(truth), os.path.join(work, "review.csv"))
    started = time.monotonic()
    second = _imagepipe(*common, "--name", "after", "--review", os.path.join(work, "review.csv"))
    line = next(x for x in second.stdout.splitlines() if x.strip().startswith("ImageExampleGen") and " ran " in x)
    result = {
        "images": images,
        "test": test,
        "flipped": len(truth),
        "seed": seed,
        **decided,
        "run2_line": line.split("; review ", 1)[-1].strip(),
        "before": score(root, "before", held),
        "after": score(root, "after", held),
        "seconds": [round(first_seconds), round(time.monotonic() - started)],
    }
    print(json.dumps(result), flush=True)
    return result


def table(results) -> None:
    print("| seed | flipped | reviewed (relabelled) | accuracy before -> after | balanced | lowest class recall |")
    print("|---:|---:|---|---|---|---|")
    for r in results:
        b, a = r["before"], r["after"]
        print(
            f"| {r['seed']} | {r['flipped']} of {r['images']} | {r['reviewed']} ({r.get('relabel', 0)}) | "
            f"{b['accuracy']:.3f} -> {a['accuracy']:.3f} | {b['balanced_accuracy']:.3f} -> "
            f"{a['balanced_accuracy']:.3f} | {b['lowest_class_recall']:.2f} ({b['lowest_class']}) -> "
            f"{a['lowest_class_recall']:.2f} ({a['lowest_class']}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--share", type=float, default=0.15, help="the share of labels flipped")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--table", action="store_true", help="print the saved results' table; run nothing")
    args = parser.parse_args()
    path = os.path.join(OUT, "results.json")
    if not args.table:
        save_results([run(args.images, args.test, args.share, int(s)) for s in args.seeds.split(",")], path)
    table(json.load(open(path)))


if __name__ == "__main__":
    main()
