"""Accuracy against what users would write instead: `imagepipe run` with its defaults vs the plain Keras script.

    python -m bench.accuracy_benchmark                       # digits and shapes, seeds 1, 2, 3
    python -m bench.accuracy_benchmark --sets shapes --seeds 1 --per-class 200

For each image set (written in class-folder order, as users' sets are) and each seed:
  - `imagepipe run --data SET --seed S` in a fresh process and a fresh --root, every setting at its
    default; its accuracy is the Evaluator's, on imagepipe's eval split;
  - bench/plain_keras.py (image_dataset_from_directory, the same CNN, 12 epochs, batch 64, Adam 1e-3)
    in a fresh process, trained on the files of imagepipe's train split and scored on those of its
    eval split (hard links in train/ and eval/ class folders): the same held-out images.
Sets: `digits` (scikit-learn's 1,797 digits, the sample) and `shapes` (bench/shapes.py: ten shapes on
photo backgrounds, harder). Seconds are wall time of each process: imagepipe's is the whole pipeline
(ingestion, validation, Transform, training, evaluation), with its Trainer's share beside it.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench import recipe_folders, run_recipe

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "accuracy")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


def make_set(name: str, per_class: int) -> str:
    if name == "digits":
        from pipeline.sample_data import make_digits

        return make_digits(os.path.join(OUT, "digits"))["path"]
    from bench.shapes import make_shapes

    return make_shapes(os.path.join(OUT, f"shapes-{per_class}"), per_class)


def run_imagepipe(data: str, seed: int, root: str) -> dict:
    started = time.monotonic()
    proc = subprocess.run(
        [IMAGEPIPE, "run", "--data", data, "--root", root, "--seed", str(seed), "--progress", "json"],
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    finished = next((e for e in events if e["event"] == "run_finished"), None)
    if proc.returncode != 0 or finished is None:
        raise RuntimeError(f"imagepipe run failed:\n{proc.stderr[-3000:]}")
    parts = {c["component"]: c for c in finished["components"]}
    trainer = parts["Trainer"]["details"]
    return {
        "accuracy": parts["Evaluator"]["details"]["accuracy"],
        "seconds": seconds,
        "trainer_seconds": parts["Trainer"]["seconds"],
        "epochs": trainer["epochs"],
        "kept_epoch": trainer["kept_epoch"],
        "examples": parts["ImageExampleGen"]["outputs"]["examples"][0],
    }


def split_folders(examples_uri: str, data: str, out: str) -> None:
    """out/train/<class>/..., out/eval/<class>/...: hard links to the files of imagepipe's splits."""
    import tensorflow as tf

    for split in ("train", "eval"):
        files = sorted(glob.glob(os.path.join(examples_uri, f"Split-{split}", "*.gz")))
        for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            rel = feature["image/filename"].bytes_list.value[0].decode()
            label = feature["image/class/text"].bytes_list.value[0].decode()
            dest = os.path.join(out, split, label, rel.replace("/", "_"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.link(os.path.join(data, rel), dest)


def run_plain(folders: str, seed: int, size: int) -> dict:
    return run_recipe("bench.plain_keras", *recipe_folders(folders), "--size", str(size), "--seed", str(seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="digits,shapes")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--per-class", type=int, default=500, help="images per class of the shapes set")
    parser.add_argument("--size", type=int, default=64, help="the plain script's image size (imagepipe's cnn default)")
    args = parser.parse_args()
    results = []
    for name in args.sets.split(","):
        data = make_set(name, args.per_class)
        for seed in map(int, args.seeds.split(",")):
            work = tempfile.mkdtemp(prefix=f"imagepipe-accuracy-{name}-")
            try:
                mine = run_imagepipe(data, seed, os.path.join(work, "root"))
                split_folders(mine["examples"], data, os.path.join(work, "split"))
                plain = run_plain(os.path.join(work, "split"), seed, args.size)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results.append({"set": name, "seed": seed, "imagepipe": mine, "plain": plain})
            print(
                f"{name} seed {seed}: imagepipe {mine['accuracy']:.4f} ({mine['epochs']} epochs, kept "
                f"{mine['kept_epoch']}; {mine['seconds']:.0f} s, Trainer {mine['trainer_seconds']:.0f} s), "
                f"plain Keras {plain['accuracy']:.4f} ({plain['seconds']:.0f} s)",
                flush=True,
            )
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(
        "\n| set | seed | imagepipe (defaults) | plain Keras script | difference | imagepipe s (Trainer s) | plain s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        mine, plain = r["imagepipe"], r["plain"]
        print(
            f"| {r['set']} | {r['seed']} | {mine['accuracy']:.4f} | {plain['accuracy']:.4f} | "
            f"{mine['accuracy'] - plain['accuracy']:+.4f} | {mine['seconds']:.0f} ({mine['trainer_seconds']:.0f}) | "
            f"{plain['seconds']:.0f} |"
        )
    for name in args.sets.split(","):
        rows = [r for r in results if r["set"] == name]
        mine = statistics.mean(r["imagepipe"]["accuracy"] for r in rows)
        plain = statistics.mean(r["plain"]["accuracy"] for r in rows)
        print(f"| {name} | mean | {mine:.4f} | {plain:.4f} | {mine - plain:+.4f} | | |")


if __name__ == "__main__":
    main()
