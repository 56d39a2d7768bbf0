"""The hot paths on both stacks, side by side in one run: ingestion, training input, the features step's backbone and
predict, each on the legacy stack (TFX 1.16, TF 2.16, Python 3.10) and the modern one (TFX 1.21, TF 2.21, Python 3.13).

    python -m bench.stacks_benchmark                        # 2,000 photo-like JPEGs, 3 rounds (make bench-stacks)
    python -m bench.stacks_benchmark --files 500 --rounds 1

Every measurement is a fresh process of one stack's interpreter: the legacy stack's .venv and the modern stack's
venv (natively where the glibc is 2.39 or newer, else in the Debian 13 root through stacks/in_root.sh; run
`make install STACK=legacy` and `make install STACK=modern` first). Within a round each stage runs on one stack then
the other, so machine noise hits both alike; the table shows medians and the modern/legacy ratio of each. Both read
the same corpus, the same cached records (bench/input_benchmark.py) and serve the same model (trained once, on the
legacy stack, by bench/predict_benchmark.py).

Stages:
  ingest     ImageExampleGen's executor on the corpus (bench/ingest_benchmark.py `examplegen`): files/s, after imports
  input      the Trainer's input pipeline on uint8 records, 160 px, batch 128 (bench/input_benchmark.py
             `trainer input`): images/s, and one fit epoch of a small head
  features   the features step's backbone: EfficientNet-Lite0's frozen graph at 224 px (components/features/backbone.py),
             batches of 32 decoded pixels: images/s
  predict    `imagepipe predict --output` in process on the corpus: whole-command seconds, TensorFlow's import included
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench import corpus as corpus_lib

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(PROJECT, "bench", "out")
STACKS = ("legacy", "modern")
STAGES = ("ingest", "input", "features", "predict")
FEATURE_IMAGES = 512  # the features stage's images (the backbone dominates: ~10 ms an image here)


def interpreter(stack: str) -> list:
    """The command that starts `stack`'s Python in this checkout."""
    if stack == "legacy":
        return [os.path.join(PROJECT, ".venv", "bin", "python")]
    native = os.path.join(PROJECT, ".venv", "bin", "python")
    check = "import sys; sys.exit(sys.version_info[:2] < (3, 12))"
    if os.path.exists(native) and subprocess.run([native, "-c", check]).returncode == 0:
        return [native]
    return [os.path.join(PROJECT, "stacks", "in_root.sh"), os.path.join(PROJECT, ".stacks", "debian13"),
            os.path.join(PROJECT, ".stacks", "venv-modern", "bin", "python")]  # fmt: skip


def _measure_features(corpus: str) -> dict:
    """In this process: the features step's backbone on FEATURE_IMAGES corpus images."""
    import tempfile

    import numpy as np
    from PIL import Image

    from components.features import backbone
    from trainer.hparams import HParams

    hp = HParams(model="efficientnet_lite0", image_size=224)
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(corpus) for f in fs if f.endswith(".jpg"))
    pixels = []
    for path in paths[:FEATURE_IMAGES]:
        try:
            pixels.append(np.asarray(Image.open(path).convert("RGB").resize((224, 224), Image.BILINEAR)))
        except OSError:  # the corpus's planted bad files
            continue
    pixels = np.stack(pixels)
    with tempfile.TemporaryDirectory(dir=OUT) as cache:
        extract = backbone.load_extractor(hp, backbone.prepare(hp, cache))
        extract(pixels[:32].astype("float32"))  # warm-up: the graph's first call
        started = time.monotonic()
        for start in range(0, len(pixels), 32):
            np.asarray(extract(pixels[start : start + 32].astype("float32")))  # numpy or a tensor (before)
        seconds = time.monotonic() - started
    return {"images": len(pixels), "images_per_s": len(pixels) / seconds}


def _command(stage: str, stack: str, corpora: dict, model: str) -> list:
    python = interpreter(stack)
    if stage == "ingest":
        return python + ["-m", "bench.ingest_benchmark", "--measure", "examplegen", "--corpus", corpora["ingest"]]
    if stage == "input":
        return python + ["-m", "bench.input_benchmark", "--measure", "trainer input", "--corpus", corpora["input"]]
    if stage == "features":
        return python + ["-m", "bench.stacks_benchmark", "--measure", "features", "--corpus", corpora["ingest"]]
    output = os.path.join(OUT, f"stacks-predict-{stack}.jsonl")
    return python + ["-m", "cli", "predict", "--model", model, "--output", output, corpora["ingest"]]


def measure(stage: str, stack: str, corpora: dict, model: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    started = time.monotonic()
    done = subprocess.run(_command(stage, stack, corpora, model), capture_output=True, text=True, env=env, cwd=PROJECT)
    seconds = time.monotonic() - started
    if stage == "predict":
        if done.returncode not in (0, 1):  # 1: the corpus's planted bad files, named
            raise RuntimeError(f"predict on the {stack} stack failed:\n{done.stderr[-3000:]}")
        return {"seconds": seconds}
    if done.returncode != 0:
        raise RuntimeError(f"{stage} on the {stack} stack failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# What the table shows of each stage: (label, key, higher is better).
FIGURES = {
    "ingest": [("ImageExampleGen files/s (after imports)", lambda r: r["files"] / r["work_seconds"])],
    "input": [
        ("training input images/s", lambda r: r["images_per_s"]),
        ("fit epoch seconds (small head)", lambda r: r["fit_epoch_seconds"]),
    ],
    "features": [("Lite0 backbone images/s (224 px)", lambda r: r["images_per_s"])],
    "predict": [("`imagepipe predict` seconds (whole command)", lambda r: r["seconds"])],
}


def _corpora(files: int) -> dict:
    ingest = os.path.join(OUT, f"corpus-{files}")
    clean = os.path.join(OUT, f"clean-corpus-{files}")
    if not os.path.exists(ingest):
        corpus_lib.build(ingest, files)
    if not os.path.exists(clean):
        corpus_lib.build(clean, files, bad_files=False)
    return {"ingest": ingest, "input": clean}


def _model() -> str:
    """The model predict serves on both stacks: trained once by the legacy stack (bench/predict_benchmark.py)."""
    code = "from bench.predict_benchmark import train_model; print(train_model())"
    done = subprocess.run(interpreter("legacy") + ["-c", code], capture_output=True, text=True, cwd=PROJECT)
    if done.returncode != 0:
        raise RuntimeError(f"training the predict model failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--measure", choices=("features",), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(_measure_features(args.corpus)))
        return 0
    os.makedirs(OUT, exist_ok=True)
    stages = args.stages.split(",")
    corpora = _corpora(args.files)
    model = _model() if "predict" in stages else ""
    runs = {(stage, stack): [] for stage in stages for stack in STACKS}
    for round_ in range(args.rounds):
        for stage in stages:
            for stack in STACKS if round_ % 2 == 0 else reversed(STACKS):  # who goes first alternates
                runs[stage, stack].append(measure(stage, stack, corpora, model))
                print(f"round {round_ + 1} {stage} {stack}: {runs[stage, stack][-1]}", file=sys.stderr)
    print(f"{args.files:,} photo-like JPEGs, {args.rounds} rounds, medians\n")
    print("| stage | figure | legacy | modern | modern / legacy |\n|---|---|---:|---:|---:|")
    for stage in stages:
        for label, figure in FIGURES[stage]:
            legacy, modern = (statistics.median(figure(r) for r in runs[stage, stack]) for stack in STACKS)
            print(f"| {stage} | {label} | {legacy:,.2f} | {modern:,.2f} | {modern / legacy:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
