"""Hyperparameter search: `imagepipe run --tune N` against the same run with the defaults, side by side.

    python -m bench.tuning_benchmark                  # both sets below (~15 minutes)
    python -m bench.tuning_benchmark --sets photos --trials 8

Two sets, each run twice in a fresh process and a fresh --root, first with the defaults, then with
--tune N:

  photos   2,000 photo-like JPEGs (bench/corpus.py, as bench/features_benchmark.py makes them), the
           transfer path a team with photos takes: MobileNetV2 at 160 px (random weights, BatchNorm
           calibrated: nothing downloads), 10 frozen epochs; 20 trials, each a head on the features
           step's cached features. The default learning rate (1e-3) and head leave accuracy behind there.
  shapes   bench/shapes.py's ten shapes on photo backgrounds (300 a class), the small cnn on pixels,
           12 epochs; 10 trials, each a training of its own.

Reported: eval accuracy, the Trainer's and the Tuner's seconds, the search's cost as a multiple of one
default training (Tuner / the defaults' Trainer), and the values the search chose.
"""

import argparse
import json
import os
import shutil
import sys
from typing import Dict, List

from bench.photo_benchmark import OUT, PROJECT, printed_saved_table, run_pipeline, save_results

HERE = os.path.join(OUT, "tuning")


def table(rows: List[Dict]) -> List[str]:
    lines = [
        "| set | run | eval accuracy | Trainer s | Tuner s | search / training | values chosen |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = f"{r['tuner_s'] / r['trainer_s']:.2f}x" if r.get("tuner_s") and r.get("trainer_s") else "-"
        values = ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in (r["tuned"] or {}).items()
        )
        accuracy = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
        lines.append(
            f"| {r['set']} | {r['run']} | {accuracy} | {r['trainer_s'] or '-'} | {r.get('tuner_s') or '-'} "
            f"| {ratio} | {values or '-'} |"
        )
    by_set: Dict[str, Dict[str, Dict]] = {}
    for r in rows:
        by_set.setdefault(r["set"], {})[r["run"]] = r
    for name, runs in by_set.items():
        default, tuned = runs.get("defaults"), next((r for k, r in runs.items() if k != "defaults"), None)
        if default and tuned and default["accuracy"] is not None and tuned["accuracy"] is not None:
            lines.append(
                f"\n{name}: the tuned run's eval accuracy {tuned['accuracy'] - default['accuracy']:+.4f} "
                f"against the defaults; the search cost {tuned['tuner_s'] / default['trainer_s']:.2f}x one "
                "default training"
            )
    return lines


SETS = {
    "photos": {"trials": 20, "epochs": 10, "label": "photos 2,000, mobilenet_v2 160 px"},
    "shapes": {"trials": 10, "epochs": 12, "label": "shapes 3,000, cnn 96 px"},
}


def dataset(name: str):
    """(data folder, extra `imagepipe run` options) of a set."""
    if name == "photos":
        from bench import features_benchmark

        data = features_benchmark.spans(2000)["span-1"]
        return data, [
            "--model",
            "mobilenet_v2",
            "--image-size",
            "160",
            "--weights",
            features_benchmark.weights_file(data),
        ]
    from bench.shapes import make_shapes

    return make_shapes(os.path.join(HERE, "shapes-300"), per_class=300), ["--image-size", "96"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="photos,shapes")
    parser.add_argument("--trials", type=int, help="trials per search (default: 20 photos, 10 shapes)")
    parser.add_argument("--out", default=os.path.join(OUT, "tuning_benchmark.json"))
    parser.add_argument("--table", action="store_true", help="print the table of --out; run nothing")
    args = parser.parse_args(argv)
    if printed_saved_table(args, table):
        return 0
    rows = []
    for name in args.sets.split(","):
        spec = SETS[name]
        data, extra = dataset(name)
        trials = args.trials or spec["trials"]
        extra += ["--accuracy-threshold", "0", "--patience", str(spec["epochs"])]
        for run, more in (("defaults", []), (f"--tune {trials}", ["--tune", str(trials)])):
            root = os.path.join(HERE, "runs", f"{name}-{run.replace(' ', '').replace('-', '')}")
            result = run_pipeline(PROJECT, data, root, spec["epochs"], 18 << 30, extra + more)
            seconds = {component: s for component, (s, _) in result["components"].items()}
            rows.append(
                {
                    "set": spec["label"],
                    "run": run,
                    "status": result["status"],
                    "error": result["error"],
                    "accuracy": result["accuracy"],
                    "trainer_s": seconds.get("Trainer"),
                    "tuner_s": seconds.get("Tuner"),
                    "tuned": (result["details"].get("Tuner") or {}).get("best"),
                    "wall_s": result["wall_seconds"],
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
            shutil.rmtree(root, ignore_errors=True)
        save_results(rows, args.out)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
