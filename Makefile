# Two commands on a fresh machine: `make run` and `make test`.
# Both create .venv with Python 3.10 and install the locked TFX 1.16 stack with uv.

PYTHON ?= python3.10
VENV ?= .venv
UV_VERSION := 0.13.9
BIN := $(VENV)/bin
UV := $(BIN)/uv pip install --python $(BIN)/python

.PHONY: install run lint format test test-fast bench bench-photos bench-determinism bench-predict bench-accuracy bench-features \
	bench-health bench-tuning bench-imbalance bench-multilabel bench-explain bench-transfer bench-scale bench-exports bench-review lock clean

install: $(VENV)/.installed

# --compile-bytecode matters: with PYTHONDONTWRITEBYTECODE set (as on CI) nothing else
# writes .pyc files, and every process would recompile TensorFlow (import 12 s instead of 4 s).
$(VENV)/.installed: requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null || { \
	  echo "error: '$(PYTHON)' is not Python 3.10 (TFX 1.16 needs it); install it (e.g. 'pyenv install 3.10.13') or run make PYTHON=/path/to/python3.10" >&2; exit 1; }
	@if [ -x $(BIN)/python ] && ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))'; then rm -rf $(VENV); fi
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) --compile-bytecode -r requirements.lock
	$(UV) --no-deps -e .
	@touch $@

run: install
	$(BIN)/imagepipe run

# Two pytest-xdist workers: most tests wait on a process start, an import or one thread, so two
# keep 2 cores busy; tests that share a pipeline run stay in one worker (tests/conftest.py).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

test: install
	$(PYTEST)

# The linter and the formatter (settings in pyproject.toml); `make format` rewrites what `make lint` would refuse.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The edit-test loop: everything but the tests marked slow (whole pipeline runs, training).
test-fast: install
	$(PYTEST) -m "not slow"

# Ingestion against the classic loop and the decode bounds, side by side with the code before near-duplicate
# detection (a60a88b), at 4,000 and 40,000 files (the larger corpus is ~1.1 GB in bench/out; ~15 minutes).
bench: install
	$(BIN)/python -m bench.ingest_benchmark --rounds 3 --sizes 4000,40000 --baseline a60a88b
	$(BIN)/python -m bench.input_benchmark --rounds 3

# The whole pipeline on 12 MP photos (500 and 2,000; ~9.4 GB of JPEGs made in bench/out/), against the
# code before full-resolution support; about 20 minutes on 2 cores.
bench-photos: install
	$(BIN)/python -m bench.photo_benchmark --sizes 500,2000

# What reproducible training costs: the digits sample with TensorFlow op determinism on and off (~4 min).
bench-determinism: install
	$(BIN)/python -m bench.determinism_benchmark --rounds 3

# imagepipe predict three ways (the code before batch prediction, in-process, Beam with 2 workers) on
# 2,000 and 8,000 PetImages-sized JPEGs; trains a small model first (~4 minutes in all).
bench-predict: install
	$(BIN)/python -m bench.predict_benchmark --sizes 2000,8000

# Accuracy against the plain Keras script (image_dataset_from_directory, the same CNN, 12 epochs) on the
# digits and a generated shapes set written in class-folder order, same held-out split, 3 seeds (~25 minutes).
bench-accuracy: install
	$(BIN)/python -m bench.accuracy_benchmark --sets digits,shapes --seeds 1,2,3 --per-class 500

# Transfer learning with the features step against the code before it (bcac092): MobileNetV2 at 160 px,
# 2,000 and 8,000 photo-like JPEGs, 10 frozen epochs, then a span with 10% new images (~1 hour).
bench-features: install
	$(BIN)/python -m bench.features_benchmark --sizes 2000,8000

# Data health on planted problems (5% flipped labels, 5% near-duplicate copies): what it finds and what
# it costs against the code before it (a60a88b), digits and shapes, cnn and transfer (~15 minutes).
bench-health: install
	$(BIN)/python -m bench.health_benchmark

# Hyperparameter search: --tune N against the defaults, on 2,000 photo-like JPEGs (MobileNetV2, trials on the
# cached features) and on the shapes set (the cnn, trials on pixels) (~15 minutes).
bench-tuning: install
	$(BIN)/python -m bench.tuning_benchmark
	$(BIN)/python -m bench.tuner_input_benchmark

# Imbalanced classes: imagepipe's defaults against the plain Keras script and the Keras class_weight recipe on
# generated sets (2% and 10% defects, a ten-class long tail), presplit, 3 seeds (~35 minutes).
bench-imbalance: install
	$(BIN)/python -m bench.imbalance_benchmark --seeds 1,2,3

bench-multilabel: install
	$(BIN)/python -m bench.multilabel_benchmark --seeds 1,2

bench-explain: install
	$(BIN)/python -m bench.explain_benchmark

# Transfer learning: the default run (--model auto: the pretrained EfficientNet-Lite0 on photo-sized images) against
# the Keras CNN script, its class_weight recipe and the Keras transfer-learning recipe with the same backbone, on a
# marked-object set, 2% defects and a long tail, 2 seeds; and the default at 160, 192 and 224 px (~1.5 hours).
bench-transfer: install
	$(BIN)/python -m bench.transfer_benchmark --seeds 1,2
	$(BIN)/python -m bench.transfer_benchmark --seeds 1 --sizes 160,192,224 --no-default --no-baselines

# The whole DAG at 10,000, 30,000 and 100,000 diverse photo-like images (bench/scale_set.py, ~1.6 GB at 100,000):
# each stage's seconds and the peak memory of the whole process tree; the default run, then the cnn (~4 hours).
# The review loop: a run on 2,000 photo-like images with 15% of labels flipped, one review of its top suspects
# (decided from the truth), the run after it; both models on a clean test set (docs/benchmarks.md, Review).
bench-review: install
	$(BIN)/python -m bench.review_benchmark

bench-scale: install
	$(BIN)/python -m bench.scale_benchmark --sizes 10000,30000,100000
	$(BIN)/python -m bench.scale_benchmark --sizes 10000,30000,100000 --extra=--model --extra=cnn --name cnn

# Each export's size and latency per image (SavedModel, TFLite, ONNX; Core ML's size), on a photo model and the
# digits' cnn (~5 minutes).
bench-exports: install
	$(BIN)/python -m bench.export_benchmark

# Regenerate the lock after changing dependencies in pyproject.toml.
lock: install
	$(BIN)/uv pip compile pyproject.toml --extra test --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "make lock" \
	  -o requirements.lock

clean:
	rm -rf $(VENV) .imagepipe bench/out
