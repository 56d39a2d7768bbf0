"""Batch prediction benchmark: `imagepipe predict` ways side by side on PetImages-sized JPEGs.

    python -m bench.predict_benchmark                      # 2,000 and 8,000 files, 1 round
    python -m bench.predict_benchmark --sizes 500 --rounds 1 --model PATH

Each measurement is a fresh process; its whole tree's memory (Beam's worker processes
included) is sampled every 0.1 s for the peak. "img/s" is files / wall time including
start-up (TensorFlow's import, the model's load, Beam's workers); "marginal img/s" is
(largest - smallest size) / (their time difference), the rate once started.

Methods:
  before   the predict of before batch prediction: every file read into memory, checked,
           then served in byte-bounded batches; results printed at the end (kept below)
  stream   `imagepipe predict --output x.jsonl`: streamed, the next batch read while one is served
  beam-N   `imagepipe predict --workers N --output x.jsonl`: Beam RunInference in N processes

Without --model, a model is trained first on 300 corpus images (`imagepipe run`, 2 epochs).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench import corpus as corpus_lib
from images.bounds import MAX_PIXELS

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def before(model_dir: str, corpus: str) -> int:
    """The predict that batch prediction replaced, as it was: reads every file first, holds them all."""
    import tensorflow as tf

    from images.image_check import BadImage, check_image
    from prediction.image_inputs import byte_batches

    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(corpus) for f in fs)
    results, images = [None] * len(paths), []
    for i, path in enumerate(paths):
        try:
            with open(path, "rb") as f:
                data = f.read()
            check_image(data, MAX_PIXELS)
        except (OSError, BadImage) as e:
            results[i] = {"path": path, "error": str(e)}
            continue
        images.append((i, data))
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    for batch in byte_batches(images, size=lambda item: len(item[1])):
        out = serve(image_bytes=tf.constant([data for _, data in batch]))
        names = [n.decode() for n in out["class_names"].numpy()[0]]
        for (i, _), row in zip(batch, out["probabilities"].numpy()):
            results[i] = {"path": paths[i], "predictions": [(names[row.argmax()], float(row.max()))]}
    for result in results:
        print(json.dumps(result))
    return len(results)


def command(method: str, model_dir: str, corpus: str, output: str):
    if method == "before":
        return [sys.executable, "-m", "bench.predict_benchmark", "--measure-before", model_dir, corpus]
    cli = [sys.executable, "-m", "cli", "predict", "--model", model_dir, "--output", output, corpus]
    if method.startswith("beam-"):
        cli += ["--workers", method.split("-")[1]]
    return cli


def measure(method: str, model_dir: str, corpus: str) -> dict:
    """Wall time and the peak of the summed RSS of the process and all its descendants."""
    import psutil

    output = os.path.join(OUT, "predict-results.jsonl")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    started = time.monotonic()
    proc = subprocess.Popen(
        command(method, model_dir, corpus, output), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.1)
    wall = time.monotonic() - started
    stderr = proc.stderr.read().decode(errors="replace")
    if proc.returncode not in (0, 1):  # 1: the corpus's bad files failed, as they should
        raise RuntimeError(f"{method} on {corpus} failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    if os.path.exists(output):
        os.remove(output)
    return {"seconds": wall, "peak_mb": peak / 2**20}


def train_model(files: int = 300) -> str:
    """A model of the pipeline's default architecture, trained briefly on corpus images."""
    from prediction import predict

    root = os.path.join(OUT, "predict-root")
    serving = os.path.join(root, "serving", "bench-predict")
    try:
        return predict.resolve_model_dir(serving)
    except predict.ModelNotFound:
        pass
    data = ensure_corpus(files)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            "--data",
            data,
            "--root",
            root,
            "--name",
            "bench-predict",
            "--epochs",
            "2",
            "--accuracy-threshold",
            "0",
            "--progress",
            "quiet",
        ],
        check=True,
    )
    return predict.resolve_model_dir(serving)


def ensure_corpus(files: int) -> str:
    path = os.path.join(OUT, f"corpus-{files}")
    if not os.path.exists(path):  # corpus.build renames a finished corpus into place
        print(f"built {corpus_lib.build(path, files)}", file=sys.stderr)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,8000")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--methods", default="before,stream,beam-2")
    parser.add_argument("--model", help="a SavedModel (default: train one on corpus images)")
    parser.add_argument("--measure-before", nargs=2, metavar=("MODEL", "CORPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_before:
        before(*args.measure_before)
        from cli.main import exit_without_teardown

        exit_without_teardown(0)  # as `python -m cli` exits: the methods compared like for like
    os.makedirs(OUT, exist_ok=True)
    model_dir = args.model or train_model()
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    corpora = {size: ensure_corpus(size) for size in sizes}
    runs = {(m, s): [] for m in methods for s in sizes}
    for _ in range(args.rounds):
        for size in sizes:
            for method in methods:  # interleaved, so machine noise hits every method alike
                runs[method, size].append(measure(method, model_dir, corpora[size]))
                print(f"{method} {size}: {runs[method, size][-1]}", file=sys.stderr)
    print("| method | files | seconds | img/s | peak RSS (MB) |\n|---|---:|---:|---:|---:|")
    table = {}
    for method in methods:
        for size in sizes:
            seconds = statistics.median(r["seconds"] for r in runs[method, size])
            peak = statistics.median(r["peak_mb"] for r in runs[method, size])
            table[method, size] = seconds
            print(f"| {method} | {size:,} | {seconds:.1f} | {size / seconds:,.0f} | {peak:,.0f} |")
    if len(sizes) > 1:
        small, large = min(sizes), max(sizes)
        print(
            "\nmarginal img/s (files past the smallest size / the extra time): "
            + ", ".join(f"{m} {(large - small) / max(table[m, large] - table[m, small], 1e-9):,.0f}" for m in methods)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
