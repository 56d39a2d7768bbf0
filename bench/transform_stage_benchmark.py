"""Transform alone, on the artifacts of a finished run, this checkout's against another's, side by side:

    python -m bench.transform_stage_benchmark --root R --baseline bench/out/base   # R: a finished run's root
    python -m bench.transform_stage_benchmark --root R --measure [--code TREE]     # one fresh process, one JSON line

Each measurement is a fresh process running the stage's executor on the inputs and parameters of the root's last
Transform execution (bench/kept_stage.py), its outputs in a fresh folder. The trees take turns, `--rounds` times; the
table gives each one's seconds (min/median/max), the process tree's peak, and what it wrote (records a split and
their bytes), which must agree.
"""

import glob
import importlib
import os

from bench.kept_stage import compare_in_turn, run_alone, stage_main


def measure(root: str) -> dict:
    """Runs Transform once in this process; its seconds, peak and what it wrote."""
    executor = importlib.import_module("components.transform.executor")

    def written(outputs: dict) -> dict:
        import tensorflow as tf

        from trainer import features

        found = {}
        for folder in sorted(glob.glob(os.path.join(outputs["transformed_examples"][0].uri, "Split-*"))):
            files = sorted(glob.glob(os.path.join(folder, "*")))
            records = sum(1 for _ in tf.data.TFRecordDataset(files, features.compression(files)))
            found[os.path.basename(folder)] = [records, sum(os.path.getsize(f) for f in files)]
        return {"code": executor.__file__, "splits": found}

    return run_alone(root, "Transform", executor.TransformExecutor, written)


def compare(root: str, trees: dict, rounds: int) -> None:
    compare_in_turn(
        "bench.transform_stage_benchmark",
        root,
        trees,
        rounds,
        [],
        ["records a split (bytes)"],
        lambda last: [", ".join(f"{s} {n:,} ({b / 1e6:,.0f} MB)" for s, (n, b) in last["splits"].items())],
    )


def main() -> None:
    stage_main(__doc__, lambda root, args: measure(root), lambda root, trees, args: compare(root, trees, args.rounds))


if __name__ == "__main__":
    main()
