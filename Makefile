# Two commands on a fresh machine: `make run` and `make test`. Each picks the stack this machine supports and says which
# in one line (stacks/__init__.py says what each is): the modern one (TFX 1.21, Python 3.12 or 3.13) where the glibc
# is 2.39 or newer, or on macOS; else the legacy one (TFX 1.16, Python 3.10). STACK=modern or STACK=legacy forces one;
# STACK=modern on an older glibc runs in a Debian 13 root made by stacks/debian_root.sh (as root; cached in .stacks/).

UV_VERSION := 0.13.9
GLIBC := $(shell ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$$')
NATIVE_STACK := $(shell if [ "$$(uname)" = Darwin ] || printf '2.39\n%s\n' "$(GLIBC)" | sort -V -C 2>/dev/null; then echo modern; else echo legacy; fi)
STACK ?= $(NATIVE_STACK)
ifeq ($(filter $(STACK),modern legacy),)
$(error STACK=$(STACK): use modern or legacy)
endif
ROOT := .stacks/debian13
ifeq ($(STACK),legacy)
PYTHON ?= python3.10
PYTHON_OK := (3, 10) == sys.version_info[:2]
PYTHON_WANTED := Python 3.10 (TFX 1.16 needs it); install it (e.g. 'pyenv install 3.10.13') or run make PYTHON=/path/to/python3.10
MADE_OF := TFX 1.16, TensorFlow 2.16, Python 3.10
OTHER := modern
else
PYTHON ?= $(firstword $(shell command -v python3.13 python3.12 2>/dev/null) python3)
PYTHON_OK := (3, 12) <= sys.version_info[:2] <= (3, 13)
PYTHON_WANTED := Python 3.12 or 3.13 (the modern stack); install one, or run make PYTHON=/path/to/python3.12
MADE_OF := TFX 1.21, TensorFlow 2.21, Python 3.12 or 3.13
OTHER := legacy
endif
LOCK := stacks/$(STACK).lock
ifeq ($(STACK)-$(NATIVE_STACK),modern-legacy)
# The modern stack in the Debian 13 root: its Python, a venv of its own beside the root, every command run inside.
IN_ROOT := stacks/in_root.sh $(ROOT)
PYTHON := /usr/bin/python3
VENV := .stacks/venv-modern
ROOT_READY := $(ROOT)/.imagepipe-root
WHERE := in the Debian 13 root ($(ROOT)): this machine's glibc $(GLIBC) is older than TFX 1.21's 2.39
else
IN_ROOT :=
VENV ?= .venv
ROOT_READY :=
WHERE := natively$(if $(GLIBC), (glibc $(GLIBC)$(if $(filter legacy,$(NATIVE_STACK)),; the modern stack needs 2.39+)))
endif
BIN := $(VENV)/bin
UV := $(IN_ROOT) $(BIN)/uv pip install --python $(BIN)/python
PY := $(IN_ROOT) $(BIN)/python

.PHONY: install stack run lint format test test-fast bench bench-photos bench-determinism bench-predict bench-accuracy \
	bench-features bench-health bench-tuning bench-imbalance bench-multilabel bench-explain bench-transfer bench-decisions bench-model-choice bench-scale \
	bench-exports bench-review bench-stacks lock clean

install: $(VENV)/.installed

# The one line: which stack, and why.
stack:
	@echo "stack: $(STACK) ($(MADE_OF)) $(WHERE); STACK=$(OTHER) for the other"

$(ROOT)/.imagepipe-root: stacks/debian_root.sh
	stacks/debian_root.sh $(ROOT)

# --compile-bytecode matters: with PYTHONDONTWRITEBYTECODE set (as on CI) nothing else
# writes .pyc files, and every process would recompile TensorFlow (import 12 s instead of 4 s).
# A venv of the other stack's Python is made anew.
$(VENV)/.installed: $(LOCK) pyproject.toml $(ROOT_READY)
	@$(IN_ROOT) $(PYTHON) -c 'import sys; sys.exit(not ($(PYTHON_OK)))' 2>/dev/null || { \
	  echo "error: '$(PYTHON)' is not $(PYTHON_WANTED)" >&2; exit 1; }
	@if [ -x $(BIN)/python ] && ! $(IN_ROOT) $(BIN)/python -c 'import sys; sys.exit(not ($(PYTHON_OK)))'; then rm -rf $(VENV); fi
	@[ -x $(BIN)/python ] || $(IN_ROOT) $(PYTHON) -m venv $(VENV)
	$(IN_ROOT) $(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) --compile-bytecode -r $(LOCK)
	$(UV) --no-deps -e .
	@touch $@

run: stack install
	$(IN_ROOT) $(BIN)/imagepipe run

# Two pytest-xdist workers: most tests wait on a process start, an import or one thread, so two
# keep 2 cores busy; tests that share a pipeline run stay in one worker (tests/conftest.py).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

test: stack install
	$(PYTEST)

# The linter and the formatter (settings in pyproject.toml); `make format` rewrites what `make lint` would refuse.
lint: install
	$(IN_ROOT) $(BIN)/ruff check .
	$(IN_ROOT) $(BIN)/ruff format --check .

format: install
	$(IN_ROOT) $(BIN)/ruff check --fix .
	$(IN_ROOT) $(BIN)/ruff format .

# The edit-test loop: everything but the tests marked slow (whole pipeline runs, training).
test-fast: stack install
	$(PYTEST) -m "not slow"

# Ingestion against the classic loop and the decode bounds, side by side with the code before near-duplicate
# detection (a60a88b), at 4,000 and 40,000 files (the larger corpus is ~1.1 GB in bench/out; ~15 minutes).
bench: install
	$(PY) -m bench.ingest_benchmark --rounds 3 --sizes 4000,40000 --baseline a60a88b
	$(PY) -m bench.input_benchmark --rounds 3

# The whole pipeline on 12 MP photos (500 and 2,000; ~9.4 GB of JPEGs made in bench/out/), against the
# code before full-resolution support; about 20 minutes on 2 cores.
bench-photos: install
	$(PY) -m bench.photo_benchmark --sizes 500,2000

# What reproducible training costs: the digits sample with TensorFlow op determinism on and off (~4 min).
bench-determinism: install
	$(PY) -m bench.determinism_benchmark --rounds 3

# imagepipe predict three ways (the code before batch prediction, in-process, Beam with 2 workers) on
# 2,000 and 8,000 PetImages-sized JPEGs; trains a small model first (~4 minutes in all).
bench-predict: install
	$(PY) -m bench.predict_benchmark --sizes 2000,8000

# Accuracy against the plain Keras script (image_dataset_from_directory, the same CNN, 12 epochs) on the
# digits and a generated shapes set written in class-folder order, same held-out split, 3 seeds (~25 minutes).
bench-accuracy: install
	$(PY) -m bench.accuracy_benchmark --sets digits,shapes --seeds 1,2,3 --per-class 500

# Transfer learning with the features step against the code before it (bcac092): MobileNetV2 at 160 px,
# 2,000 and 8,000 photo-like JPEGs, 10 frozen epochs, then a span with 10% new images (~1 hour).
bench-features: install
	$(PY) -m bench.features_benchmark --sizes 2000,8000

# Data health on planted problems (5% flipped labels, 5% near-duplicate copies): what it finds and what
# it costs against the code before it (a60a88b), digits and shapes, cnn and transfer (~15 minutes).
bench-health: install
	$(PY) -m bench.health_benchmark

# Hyperparameter search: --tune N against the defaults, on 2,000 photo-like JPEGs (MobileNetV2, trials on the
# cached features) and on the shapes set (the cnn, trials on pixels) (~15 minutes).
bench-tuning: install
	$(PY) -m bench.tuning_benchmark
	$(PY) -m bench.tuner_input_benchmark

# Imbalanced classes: imagepipe's defaults against the plain Keras script and the Keras class_weight recipe on
# generated sets (2% and 10% defects, a ten-class long tail), presplit, 3 seeds (~35 minutes).
bench-imbalance: install
	$(PY) -m bench.imbalance_benchmark --seeds 1,2,3

bench-multilabel: install
	$(PY) -m bench.multilabel_benchmark --seeds 1,2

bench-explain: install
	$(PY) -m bench.explain_benchmark

# Transfer learning: the default run (--model auto: the pretrained EfficientNet-Lite0 on photo-sized images) against
# the Keras CNN script, its class_weight recipe and the Keras transfer-learning recipe with the same backbone, on a
# marked-object set, 2% defects and a long tail, 2 seeds; and the default at 160, 192 and 224 px (~1.5 hours).
bench-decisions: install
	$(PY) -m bench.decision_benchmark --seeds 1 --baseline 619ec93

bench-model-choice: install
	$(PY) -m bench.model_choice_benchmark --seeds 1 --baseline 116db38

bench-transfer: install
	$(PY) -m bench.transfer_benchmark --seeds 1,2
	$(PY) -m bench.transfer_benchmark --seeds 1 --sizes 160,192,224 --no-default --no-baselines

# The whole DAG at 10,000, 30,000 and 100,000 diverse photo-like images (bench/scale_set.py, ~1.6 GB at 100,000):
# each stage's seconds and the peak memory of the whole process tree; the default run, then the cnn (~4 hours).
# The review loop: a run on 2,000 photo-like images with 15% of labels flipped, one review of its top suspects
# (decided from the truth), the run after it; both models on a clean test set (docs/benchmarks.md, Review).
bench-review: install
	$(PY) -m bench.review_benchmark

bench-scale: install
	$(PY) -m bench.scale_benchmark --sizes 10000,30000,100000
	$(PY) -m bench.scale_benchmark --sizes 10000,30000,100000 --extra=--model --extra=cnn --name cnn

# Each export's size and latency per image (SavedModel, TFLite, ONNX; Core ML's size), on a photo model and the
# digits' cnn (~5 minutes).
bench-exports: install
	$(PY) -m bench.export_benchmark

# The hot paths (ingestion, training input, the features step's backbone, predict) on both stacks side by side, on
# 2,000 photo-like JPEGs, 3 rounds (~15 minutes; needs both stacks installed, as on a machine whose own is legacy).
bench-stacks:
	$(MAKE) install STACK=legacy
	$(MAKE) install STACK=modern
	.venv/bin/python -m bench.stacks_benchmark

# Regenerate both locks after changing dependencies in pyproject.toml (each keeps its pins where it can). The modern
# lock is universal for Python 3.12 and 3.13 (Linux and macOS alike).
lock: install
	$(IN_ROOT) $(BIN)/uv pip compile pyproject.toml --extra test --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "make lock" \
	  -o stacks/legacy.lock
	$(IN_ROOT) $(BIN)/uv pip compile pyproject.toml --extra test --universal --python-version 3.12 \
	  --generate-hashes --custom-compile-command "make lock" -o stacks/modern.lock

clean:
	rm -rf .venv .stacks .imagepipe bench/out
