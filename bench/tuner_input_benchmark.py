"""The Tuner's input: trials that each read a split again, against trials sharing one count and one copy in memory.

    python -m bench.tuner_input_benchmark                         # 80,000 + 20,000 feature records, 5 trials
    python -m bench.tuner_input_benchmark --train 8000 --trials 10

Writes feature records as the features step writes them (1,280 float32 values, a label, a key; made once under
bench/out/tuner-input/), then times what the trials' input costs (trainer/search.py): for each trial a train
and an eval dataset (batch sizes 32, 64, 128 in turn, as the search draws them), two epochs over each. "per
trial": each dataset counts its records and fills its own cache (before); "shared": input_pipeline.read_records
once per split, every trial's datasets built on it. The two interleave in fresh processes, --rounds times.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "tuner-input")
DIM = 1280


def make_records(folder: str, train: int, evaluation: int) -> str:
    """Split-train/ and Split-eval/ of random feature records, written once (a folder of another size is kept)."""
    import tensorflow as tf

    from components.features.executor import feature_example

    root = os.path.join(folder, f"{train}-{evaluation}")
    if os.path.exists(os.path.join(root, "done")):
        return root
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("eval", evaluation)):
        os.makedirs(os.path.join(root, f"Split-{split}"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(root, f"Split-{split}", "features-00000-of-00001.tfrecord")) as writer:
            for n in range(count):
                writer.write(feature_example(rng.random(DIM, np.float32), n % 10, f"{n:08d}".encode()))
    open(os.path.join(root, "done"), "w").close()
    return root


def trials(root: str, mode: str, count: int) -> float:
    """Seconds of `count` trials' input, two epochs of train and eval each."""
    import dataclasses

    from trainer import input_pipeline
    from trainer.hparams import HParams

    train, evaluation = [os.path.join(root, "Split-train", "*")], [os.path.join(root, "Split-eval", "*")]
    hp = HParams(model="efficientnet_lite0", seed=1)
    started = time.time()
    shared = (
        {"train": input_pipeline.read_records(train, hp), "eval": input_pipeline.read_records(evaluation, hp)}
        if mode == "shared"
        else {"train": None, "eval": None}
    )  # "per-trial": each dataset reads for itself
    for t in range(count):
        trial = dataclasses.replace(hp, batch_size=(32, 64, 128)[t % 3])
        datasets = (
            input_pipeline.make_feature_dataset(
                train, trial, {"dim": DIM, "views": {}}, training=True, shared_records=shared["train"]
            ),
            input_pipeline.make_feature_dataset(
                evaluation, trial, {"dim": DIM, "views": {}}, training=False, shared_records=shared["eval"]
            ),
        )
        for _ in range(2):
            for dataset in datasets:
                for _batch in dataset:
                    pass
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=80000)
    parser.add_argument("--eval", type=int, default=20000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one measurement, in a child process
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(f"{trials(args.root, args.mode, args.trials):.2f}")
        return
    root = make_records(OUT, args.train, args.eval)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    seconds = {"per trial": [], "shared": []}
    for _ in range(args.rounds):
        for mode in seconds:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.tuner_input_benchmark",
                    "--mode",
                    mode.replace(" ", "-"),
                    "--root",
                    root,
                    "--trials",
                    str(args.trials),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            seconds[mode].append(float(done.stdout.split()[-1]))
    print(
        f"| {args.train:,} train + {args.eval:,} eval records, {args.trials} trials x 2 epochs | "
        + " | ".join(f"{min(s):.1f}-{max(s):.1f}" for s in seconds.values())
        + f" | {min(seconds['per trial']) / max(seconds['shared']):.1f}-"
        f"{max(seconds['per trial']) / min(seconds['shared']):.1f}x |"
    )


if __name__ == "__main__":
    main()
