"""What reproducible training costs: the Trainer with TensorFlow op determinism on and off.

    python -m bench.determinism_benchmark                 # the digits sample, 3 rounds
    python -m bench.determinism_benchmark --data ~/PetImages --image-size 64 --rounds 2

Each round runs the whole pipeline twice in fresh roots, deterministic then not
(alternating, so drift of the machine hits both), and reads the Trainer's
training.json: seconds per epoch (early stopping may end runs at different
epochs) and the eval accuracy. Medians. The deterministic runs must agree with
each other exactly; the others may not.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile


def one_run(data, deterministic: bool, image_size, epochs: int) -> dict:
    from pipeline import local_runner
    from pipeline.config import PipelineConfig

    root = tempfile.mkdtemp(prefix="imagepipe-determinism-")
    try:
        config = PipelineConfig(
            root=root,
            data=data,
            image_size=image_size,
            epochs=epochs,
            deterministic=deterministic,
            accuracy_threshold=0.0,
        )
        summary = local_runner.run(config)
        trainer = next(c["details"] for c in summary["components"] if c["component"] == "Trainer")
        evaluator = next(c["details"] for c in summary["components"] if c["component"] == "Evaluator")
        log = json.load(open(os.path.join(trainer["model_run"], "training.json")))
        return {
            "seconds_per_epoch": log["train_seconds"] / len(log["epochs"]),
            "epochs": len(log["epochs"]),
            "accuracy": evaluator["accuracy"],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="image folder (default: the digits sample)")
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = {True: [], False: []}
    for n in range(args.rounds):
        for deterministic in (True, False):
            results[deterministic].append(one_run(args.data, deterministic, args.image_size, args.epochs))
            print(f"round {n + 1} deterministic={deterministic}: {results[deterministic][-1]}", flush=True)
    on, off = ([r["seconds_per_epoch"] for r in results[k]] for k in (True, False))
    print("\n| op determinism | s/epoch (median) | eval accuracies |\n|---|---:|---|")
    for label, key, times in (("on (default)", True, on), ("off (--nondeterministic)", False, off)):
        accuracies = ", ".join(f"{r['accuracy']:.4f}" for r in results[key])
        print(f"| {label} | {statistics.median(times):.3f} | {accuracies} |")
    print(f"\ncost of determinism: {statistics.median(on) / statistics.median(off):.2f}x the time per epoch")


if __name__ == "__main__":
    main()
