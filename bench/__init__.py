"""Benchmarks: commands, not tests (`python -m bench.<name>`; the make targets in the Makefile; the figures in
docs/benchmarks.md). Each measures side by side in one run, against a baseline commit's worktree where it says so.

What they run on, made here with no network:
  corpus.py                   photo-like JPEGs (ingestion, input, prediction)
  photos.py                   12 MP camera-like photos
  shapes.py                   ten shapes on photo backgrounds: harder than the digits
  imbalanced.py               defect and long-tail sets, presplit
  multilabel.py               0 to 3 of five planted objects an image
  planted.py                  a planted patch or shortcut decides the class (explanations)
  scale_set.py                a large, diverse photo-like set (the scale benchmark)
  backbones.py                backbone weights made here, never ImageNet's downloaded
  kept_stage.py               a finished run's stage again: its last inputs, another checkout's code
What users would write instead:
  plain_keras.py              the Keras tutorial recipe, as a script
  plain_keras_transfer.py     the Keras transfer-learning guide's recipe
  plain_keras_multilabel.py   the Keras multi-label recipe
  classic_loop.py             the notebook loop ImageExampleGen replaces
The benchmarks:
  ingest_benchmark.py         ImageExampleGen against the classic loop and the decode bounds
  input_benchmark.py          the Trainer's input function against the usual Keras loaders
  holdout_input_benchmark.py  the pixel input with and without a holdout part
  tuner_input_benchmark.py    the Tuner's trials reading a split again, against one shared copy
  photo_benchmark.py          the whole pipeline on 12 MP photos against a baseline
  accuracy_benchmark.py       `imagepipe run`'s defaults against the plain Keras script
  transfer_benchmark.py       the default run (--model auto) against the Keras recipes on photo-like sets
  features_benchmark.py       the features step against the code before it
  model_choice_benchmark.py   --model auto by measurement against the commit before
  decision_benchmark.py       the operating point on imbalanced sets against the anchors
  imbalance_benchmark.py      imbalanced classes: the defaults against plain Keras and class_weight
  multilabel_benchmark.py     multi-label against the plain Keras multi-label script
  tuning_benchmark.py         `--tune N` against the defaults
  determinism_benchmark.py    the Trainer with TensorFlow op determinism on and off
  health_benchmark.py         data health on planted flips and near-duplicate copies
  transform_stage_benchmark.py  Transform alone on a finished run, against another checkout's
  features_stage_benchmark.py  BackboneFeatures alone on a finished run (an empty cache), against another's
  health_stage_benchmark.py   DataHealth alone on a finished run: seconds and peak memory
  evaluator_stage_benchmark.py  the Evaluator alone on a finished run, against another checkout's
  trainer_stage_benchmark.py  the Trainer alone on a finished run (--model auto's trials): seconds, peak
  review_benchmark.py         the review loop's worth: a run, one review, the run again
  explain_benchmark.py        attribution methods: what they find and what a map costs
  predict_benchmark.py        `imagepipe predict` three ways
  export_benchmark.py         each export's size and latency per image
  scale_benchmark.py          the whole DAG at growing sizes: each stage's seconds, the process tree's peak
  stacks_benchmark.py         the hot paths on both stacks, side by side
"""

import json
import os
import subprocess
import sys
import time


def measure_in_fresh_process(module: str, args: list) -> dict:
    """Runs `python -m module --measure ... args` in a new process (no warm imports or caches
    carried over); returns the JSON object it prints last, with its wall time as process_seconds."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.monotonic() - started
    return result


def run_recipe(module: str, *args: str) -> dict:
    """What a user would write instead (bench.plain_keras, plain_keras_transfer, plain_keras_multilabel), run as a
    script: `python -m module args...`; returns the JSON object it prints last (its own seconds among them)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def recipe_folders(data: str) -> list:
    """--train and --eval for a recipe, of a presplit set (<data>/train/<class>/, <data>/eval/<class>/)."""
    return ["--train", os.path.join(data, "train"), "--eval", os.path.join(data, "eval")]


def examplegen_package(code_dir: str) -> str:
    """ImageExampleGen's package in the code at `code_dir` (a baseline commit's worktree, or this checkout):
    components.example_gen, or components.image_example_gen in commits before the move to a folder per stage (issue 41)."""
    moved = os.path.isdir(os.path.join(code_dir, "components", "example_gen"))
    return "components.example_gen" if moved else "components.image_example_gen"
