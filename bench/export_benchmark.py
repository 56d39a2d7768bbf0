"""Each export's size and latency per image on this machine: the SavedModel, TFLite float16 and int8, ONNX, Core ML.

    python -m bench.export_benchmark                       # trains the models first (~5 minutes)
    python -m bench.export_benchmark --table               # the saved results' table

Two models, each from `imagepipe run --tflite float16,int8 --exports onnx,coreml` in a fresh root: the default
model on a photo-like set (bench/imbalanced.py's defect scenes, 300 images, 160-240 px: EfficientNet-Lite0 at
224 px) and the cnn on the digits sample (32 px). Each export classifies the same 200 images of its set, one image a
call (what an app does) and in batches of 32 where the format takes a batch, after a warm-up: the median of 3
rounds, in milliseconds an image. The SavedModel takes encoded bytes (its decode included); the others the
pixels decoded and resized beforehand (as they are served). Core ML runs only on Apple's systems: its size only.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.photo_benchmark import save_results

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "exports")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")
IMAGES = 200


def train(data, root: str, extra=()) -> str:
    done = subprocess.run(
        [
            IMAGEPIPE,
            "run",
            "--root",
            root,
            *(["--data", data] if data else []),
            "--tflite",
            "float16,int8",
            "--exports",
            "onnx,coreml",
            "--accuracy-threshold",
            "0",
            "--min-class-recall",
            "0",
            "--progress",
            "quiet",
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return sorted(glob.glob(os.path.join(root, "serving", "*", "*")))[-1]


def _images(data_dir: str):
    files = sorted(
        f
        for f in glob.glob(os.path.join(data_dir, "**", "*"), recursive=True)
        if os.path.isfile(f) and not os.path.basename(f).startswith(".")
    )
    return [open(f, "rb").read() for f in files[:: max(1, len(files) // IMAGES)][:IMAGES]]


def _timed(call, items, batch: int) -> float:
    """Milliseconds an image: the median of 3 rounds over `items` in calls of `batch`, after a warm-up call."""
    call(items[:batch])
    rounds = []
    for _ in range(3):
        started = time.perf_counter()
        for i in range(0, len(items), batch):
            call(items[i : i + batch])
        rounds.append((time.perf_counter() - started) * 1000 / len(items))
    return statistics.median(rounds)


def measure(model_dir: str, encoded) -> dict:
    import tensorflow as tf

    from trainer import model_exports, tflite_export

    saved = tf.saved_model.load(model_dir)
    serve = saved.signatures["serving_default"]
    pixels = np.concatenate(
        [saved.image_pixels(tf.constant(encoded[i : i + 32])).numpy() for i in range(0, len(encoded), 32)]
    )
    rows = {
        "SavedModel (encoded bytes)": {
            "bytes": sum(
                os.path.getsize(os.path.join(d, f))
                for d, _, fs in os.walk(model_dir)
                for f in fs
                if not any(part in d for part in ("tflite", "onnx", "coreml"))
            ),
            "one": _timed(lambda b: serve(image_bytes=tf.constant(b)), encoded, 1),
            "batch": _timed(lambda b: serve(image_bytes=tf.constant(b)), encoded, 32),
        }
    }
    for kind in ("float16", "int8"):
        path = os.path.join(model_dir, "tflite", tflite_export.file_name(kind))
        classifier = tflite_export.TFLiteClassifier(open(path, "rb").read())
        rows[f"TFLite {kind} (LiteRT)"] = {
            "bytes": os.path.getsize(path),
            "one": _timed(classifier.probabilities, pixels, 1),
            "batch": None,
        }
    onnx_path = os.path.join(model_dir, model_exports.ONNX_FILE)
    onnx = model_exports.OnnxClassifier(open(onnx_path, "rb").read())
    floats = pixels.astype(np.float32)
    rows["ONNX (onnxruntime)"] = {
        "bytes": os.path.getsize(onnx_path),
        "one": _timed(onnx.probabilities, floats, 1),
        "batch": _timed(onnx.probabilities, floats, 32),
    }
    package = os.path.join(model_dir, model_exports.COREML_PACKAGE)
    rows["Core ML (size only)"] = {
        "bytes": sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(package) for f in fs),
        "one": None,
        "batch": None,
    }
    return rows


def table(results) -> None:
    print("| model | export | size MB | ms an image, one a call | ms an image, 32 a call |")
    print("|---|---|---:|---:|---:|")
    for result in results:
        for name, row in result["rows"].items():
            one = "-" if row["one"] is None else f"{row['one']:.2f}"
            batch = "-" if row["batch"] is None else f"{row['batch']:.2f}"
            print(f"| {result['model']} | {name} | {row['bytes'] / 2**20:.2f} | {one} | {batch} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    path = os.path.join(OUT, "results.json")
    if args.table:
        table(json.load(open(path)))
        return
    from bench.imbalanced import make_defect_set

    photos = make_defect_set(os.path.join(OUT, "defect-scenes"), 200, 60, seed=4)
    results = []
    work = tempfile.mkdtemp(prefix="imagepipe-exports-")
    for label, data in (("efficientnet_lite0, 224 px (photos)", photos), ("cnn, 32 px (the digits sample)", None)):
        model_dir = train(data, os.path.join(work, f"root-{len(results)}"))
        source = photos if data else os.path.join(work, f"root-{len(results)}", "data", "digits")
        results.append({"model": label, "rows": measure(model_dir, _images(source))})
        save_results(results, path)
    table(results)


if __name__ == "__main__":
    main()
