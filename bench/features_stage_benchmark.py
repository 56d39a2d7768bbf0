"""BackboneFeatures alone, on the artifacts of a finished run, this checkout's against another's, side by side:

    python -m bench.features_stage_benchmark --root R --baseline bench/out/base   # R: a finished run's root
    python -m bench.features_stage_benchmark --root R --measure [--code TREE]     # one fresh process, one JSON line

Each measurement is a fresh process running the stage's executor on the inputs and parameters of the root's last
BackboneFeatures execution (bench/kept_stage.py), with an empty features cache of its own (a first span: every image
computed), its outputs in a fresh folder. The trees take turns, `--rounds` times; the table gives each one's seconds
(min/median/max), the process tree's peak, and the step's summary (images computed, the backbone's seconds), and the
features' checksum: the same records must give the same features (to float32 rounding across runtimes: compare the
sums' relative difference, not their bits).
"""

import importlib
import json
import os

from bench.kept_stage import compare_in_turn, run_alone, stage_main


def measure(root: str) -> dict:
    """Runs BackboneFeatures once in this process, on an empty cache; its seconds, peak and summary."""
    executor = importlib.import_module("components.features.executor")

    def own_cache(properties: dict, folder: str) -> None:
        properties[executor.CACHE_KEY] = os.path.join(folder, "cache")

    def summary(outputs: dict) -> dict:
        import numpy as np
        import tensorflow as tf

        from trainer import features

        uri = outputs[executor.OUTPUT_KEY][0].uri
        with open(os.path.join(uri, "summary.json")) as f:
            found = json.load(f)
        files = sorted(tf.io.gfile.glob(os.path.join(uri, "Split-*", "*")))
        total = 0.0
        for batch in tf.data.TFRecordDataset(files, features.compression(files)).batch(1024):
            parsed = tf.io.parse_example(batch, {features.FEATURES_KEY: tf.io.VarLenFeature(float)})
            total += float(np.abs(parsed[features.FEATURES_KEY].values.numpy()).astype(np.float64).sum())
        return {
            "code": executor.__file__,
            **{k: found[k] for k in ("images", "computed", "backbone_seconds", "cache_read_seconds")},
            "features_sum": total,
        }

    return run_alone(root, "BackboneFeatures", executor.Executor, summary, own_cache)


def compare(root: str, trees: dict, rounds: int) -> None:
    compare_in_turn(
        "bench.features_stage_benchmark",
        root,
        trees,
        rounds,
        [],
        ["images computed", "backbone s", "sum of |features|"],
        lambda last: [f"{last['computed']:,}", f"{last['backbone_seconds']:.1f}", f"{last['features_sum']:.6g}"],
    )


def main() -> None:
    stage_main(__doc__, lambda root, args: measure(root), lambda root, trees, args: compare(root, trees, args.rounds))


if __name__ == "__main__":
    main()
