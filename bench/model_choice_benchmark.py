"""--model auto by measurement (trainer/model_trials.py): the default run against the commit before, which took the
backbone's head on every photo-sized set.

    python -m bench.model_choice_benchmark --baseline 116db38      # every set, seed 1, and the commit before
    python -m bench.model_choice_benchmark --table                 # the saved results' table

Sets (presplit, made here with no network from scikit-learn's sample photos):
  marked-128  photo crops of 128 px whose class is a small pattern (24 px checks, stripes or a ring) at a random
              place (bench/planted.py --scale 2): train 150, eval 50 a class. Frozen ImageNet features miss it.
  marked-192  the same at 192 px (bench/transfer_benchmark.py's `marked`): where the head already did well
  rare-1      bench/decision_benchmark.py's imbalanced set: train ok 1,500 + defect 32, eval 375 + 16
Per run: the model kept, each candidate's held-out figure, the eval figures through the serving signature
(bench/decision_benchmark.run_imagepipe), blessed, seconds of the whole pipeline.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from bench import decision_benchmark
from bench.photo_benchmark import save_results

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "model_choice")
SETS = ("marked-128", "marked-192", "rare-1")


def make_set(name: str) -> str:
    from bench.transfer_benchmark import make_marked

    if name.startswith("marked-"):
        return make_marked(os.path.join(OUT, name), scale=int(name.split("-")[1]) // 64)
    return decision_benchmark.make_set(name)


def _trials(root: str) -> dict:
    """The kept model's training.json record of the candidates (None before the comparison existed)."""
    import glob

    logs = sorted(glob.glob(os.path.join(root, "pipelines", "*", "Trainer", "model_run", "*", "training.json")))
    return json.load(open(logs[-1])).get("model_trials") if logs else None


def _table(results) -> None:
    print(
        "\n| set | run | model kept | candidates' held-out figures | eval balanced accuracy (weakest class) | blessed | seconds |"
    )
    print("|---|---|---|---|---:|---:|---:|")
    for r in results:
        trials = r.get("trials") or {}
        said = "; ".join(
            f"{t['label']} {t['figure']:.3f}" if t["figure"] is not None else f"{t['label']} not tried"
            for t in trials.get("candidates", [])
        )
        weakest = min(r["recall"].items(), key=lambda kv: (kv[1], kv[0]))
        print(
            f"| {r['set']} | {r['method']} | {r['model']} | {said or '-'} | {r['balanced_accuracy']:.3f} "
            f"({weakest[0]} {weakest[1]:.2f}) | {r['blessed']} | {r['seconds']:.0f} |"
        )
    for name in dict.fromkeys(r["set"] for r in results):
        runs = {r["method"]: r for r in results if r["set"] == name}
        if len(runs) == 2:
            new, old = runs.values()
            print(f"{name}: seconds {new['seconds'] / old['seconds']:.2f}x the commit before's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--baseline", default="", help="also the default run at this git revision")
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
            checkouts = [("imagepipe, defaults", "")]
            if args.baseline:
                checkouts.append((f"imagepipe at {args.baseline}", decision_benchmark._worktree(args.baseline)))
            for method, checkout in checkouts:
                work = tempfile.mkdtemp(prefix=f"imagepipe-model-choice-{name}-")
                try:
                    run = decision_benchmark.run_imagepipe(data, seed, os.path.join(work, "root"), checkout)
                    run["trials"] = _trials(os.path.join(work, "root"))
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                results.append({"set": name, "seed": seed, "method": method, **run})
                print(
                    f"{name} seed {seed} {method}: {run['model']}, balanced {run['balanced_accuracy']:.3f}, "
                    f"blessed {run['blessed']}, {run['seconds']:.0f} s",
                    flush=True,
                )
                save_results(results, path)
    _table(results)
    print("mean eval balanced accuracy:", statistics.mean(r["balanced_accuracy"] for r in results))


if __name__ == "__main__":
    sys.exit(main())
