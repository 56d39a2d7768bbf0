"""Transform alone, on the artifacts of a finished run, this checkout's against another's, side by side:

    python -m bench.transform_stage_benchmark --root R --baseline bench/out/base   # R: a finished run's root
    python -m bench.transform_stage_benchmark --root R --measure [--code TREE]     # one fresh process, one JSON line

Each measurement is a fresh process running the stage's executor on the inputs and parameters of the root's last
Transform execution (bench/kept_stage.py), its outputs in a fresh folder. The trees take turns, `--rounds` times; the
table gives each one's seconds (min/median/max), the process tree's peak, and what it wrote (records a split, and a
digest of their contents in any order), which must agree.
"""

import glob
import hashlib
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
            digests = sorted(  # of each example's contents: a feature map's bytes come in any order
                hashlib.sha256(tf.train.Example.FromString(r).SerializeToString(deterministic=True)).digest()
                for r in tf.data.TFRecordDataset(files, features.compression(files)).as_numpy_iterator()
            )
            found[os.path.basename(folder)] = [len(digests), hashlib.sha256(b"".join(digests)).hexdigest()[:12]]
        return {"code": executor.__file__, "splits": found}

    return run_alone(root, "Transform", executor.TransformExecutor, written)


def compare(root: str, trees: dict, rounds: int) -> None:
    compare_in_turn(
        "bench.transform_stage_benchmark",
        root,
        trees,
        rounds,
        [],
        ["records a split (digest)"],
        lambda last: [", ".join(f"{s} {n:,} ({digest})" for s, (n, digest) in last["splits"].items())],
    )


def main() -> None:
    stage_main(__doc__, lambda root, args: measure(root), lambda root, trees, args: compare(root, trees, args.rounds))


if __name__ == "__main__":
    main()
