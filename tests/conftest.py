"""Shared test helpers: real image files made in the test, the shared pipeline runs, and how tests are spread
over pytest-xdist workers (the `imagepipe` commands tests run: tests/commands.py)."""

import io
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every command a test runs without --root writes here (each test process its own), never into the
# checkout's .imagepipe: after `imagepipe run --data ~/PetImages` there, tests that expected one pipeline
# in the default root failed.
os.environ["IMAGEPIPE_ROOT"] = tempfile.mkdtemp(prefix="imagepipe-tests-")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/ (photo generator)

from commands import IMAGEPIPE, StartedCommand, close_all, run_imagepipe  # noqa: E402


def image_bytes(fmt: str = "JPEG", size=(40, 30), mode: str = "RGB", seed: int = 0, **save_kw) -> bytes:
    """A real encoded image of random content (distinct seeds give distinct bytes)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB").convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **save_kw)
    return out.getvalue()


def write(path, data: bytes) -> str:
    path = str(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def make_class_tree(root, classes=("cat", "dog"), per_class=12, fmt="JPEG", seed=0) -> dict:
    """<root>/<class>/img-N.jpg with distinct random images; returns {relative path: label}."""
    made = {}
    for c_index, label in enumerate(classes):
        for n in range(per_class):
            rel = f"{label}/img-{n}.{fmt.lower()}"
            write(os.path.join(root, rel), image_bytes(fmt, seed=seed * 100_000 + c_index * 1000 + n))
            made[rel] = label
    return made


CHEAP_SHARED_FIXTURES = {"digits_dir", "small_digits"}  # seconds to make: every worker makes its own


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """`make test` runs two pytest-xdist workers (--dist loadgroup): tests that share an expensive
    fixture (pipeline runs made once per session or module) go to one worker, so it is made once.
    Groups with slow tests are handed out first, so that no long one starts when the rest is done."""
    units = {}
    for item in items:
        defs = item._fixtureinfo.name2fixturedefs
        shared = {
            name: d[-1].scope
            for name, d in defs.items()
            if name not in CHEAP_SHARED_FIXTURES and d[-1].baseid.startswith("tests")
        }  # ours, not pytest's
        session = sorted(name for name, scope in shared.items() if scope == "session")
        group = session[0] if session else item.module.__name__ if "module" in shared.values() else None
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        units.setdefault(group or item.nodeid, []).append(item)
    ordered = sorted(units.values(), key=lambda unit: not any(i.get_closest_marker("slow") for i in unit))
    items[:] = [item for unit in ordered for item in unit]  # a group's tests stay together (module fixtures)


def pytest_sessionfinish(session):
    close_all()
    shutil.rmtree(os.environ["IMAGEPIPE_ROOT"], ignore_errors=True)  # this test process's default root


def pytest_collection_finish(session):
    """pytest-xdist groups by a suffix it writes into node ids; when a pytest release stops that from
    taking effect (pytest-dev/pytest-xdist#1386), say so instead of making every shared run twice."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(
                f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): "
                "this pytest and pytest-xdist do not work together; see pyproject.toml"
            )


def expected_strategy_kind() -> str:
    """What trainer/strategy.py must pick on this machine: TPU, several GPUs, one GPU, else the CPU.

    Tests compare the Trainer's choice with this rule applied to the machine, never with a fixed device.
    """
    import tensorflow as tf

    from trainer import strategy

    if strategy.tpu_may_exist():
        return "tpu"
    gpus = len(tf.config.list_logical_devices("GPU"))
    return "multi-gpu" if gpus > 1 else "gpu" if gpus == 1 else "cpu"


def model_dir(summary) -> str:
    """The Trainer's model output in a run summary (the sibling of its model_run)."""
    model_run = next(c["details"]["model_run"] for c in summary["components"] if c["component"] == "Trainer")
    return os.path.join(os.path.dirname(os.path.dirname(model_run)), "model", os.path.basename(model_run))


def model_weights(summary) -> list:
    """Every weight array of the Keras model a run trained, in file order."""
    import h5py

    arrays = []
    with h5py.File(os.path.join(model_dir(summary), "keras", "model.weights.h5"), "r") as f:
        f.visititems(lambda name, item: arrays.append(item[()]) if isinstance(item, h5py.Dataset) else None)
    return arrays


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> str:
    """The full digits sample (1,797 files), made once per test session."""
    from pipeline.sample_data import make_digits

    return make_digits(str(tmp_path_factory.mktemp("sample") / "digits"))["path"]


@pytest.fixture(scope="session")
def small_digits(digits_dir, tmp_path_factory) -> str:
    """30 digits per class (300 files): enough for TFDV, fast for pipeline runs."""
    out = tmp_path_factory.mktemp("small") / "digits"
    for label in sorted(os.listdir(digits_dir)):
        if label.startswith("."):
            continue
        os.makedirs(out / label)
        for name in sorted(os.listdir(os.path.join(digits_dir, label)))[:30]:
            shutil.copy2(os.path.join(digits_dir, label, name), out / label / name)
    return str(out)


@pytest.fixture(scope="session")
def label_flip_runs(tmp_path_factory, small_digits):
    """`imagepipe run --label-check on` on the 300 small digits with 15 labels (5%) flipped (seeded), shared by the
    data health and review tests: first with a limit the flips exceed (the run stops before training), then the same
    with --gate warn (DataHealth cached, a model trained). {root, data, moved: [(given path, true label)], args (the
    warned run's), stopped, warned}."""
    data = tmp_path_factory.mktemp("flipped") / "data"
    files = sorted(
        (label, name)
        for label in os.listdir(small_digits)
        if not label.startswith(".")
        for name in os.listdir(os.path.join(small_digits, label))
    )
    rng = np.random.default_rng(3)
    flipped = set(rng.choice(len(files), size=15, replace=False).tolist())
    moved = []
    for n, (label, name) in enumerate(files):
        given = str((int(label) + 1 + int(rng.integers(9))) % 10) if n in flipped else label
        os.makedirs(data / given, exist_ok=True)
        shutil.copy(os.path.join(small_digits, label, name), data / given / name)
        if n in flipped:
            moved.append((f"{given}/{name}", label))
    root = str(tmp_path_factory.mktemp("flipped-root"))
    args = [
        "run",
        "--root",
        root,
        "--data",
        str(data),
        "--label-check",
        "on",
        "--max-label-issues",
        "0.02",
        "--epochs",
        "2",
        "--accuracy-threshold",
        "0",
        "--explanations",
        "0",  # nothing reads them here (test_explanations.py does)
    ]
    stopped = run_imagepipe(*args)
    warned = run_imagepipe(*args, "--gate", "warn")
    return {
        "root": root,
        "data": str(data),
        "moved": moved,
        "args": [*args, "--gate", "warn"],
        "stopped": stopped,
        "warned": warned,
    }


@pytest.fixture(scope="session")
def cli_runs(tmp_path_factory, small_digits):
    """`imagepipe run` as users start it, shared by the CLI, report and crash-recovery tests.

    Two runs of one pipeline started together on one root (JSON progress, then the default text output
    with --no-cache so that every component runs again); the second waits for the first's lock. Then a
    run of another dataset in the same root that the validation gate stops (a class the schema lacks).
    """
    import subprocess
    import time

    from pipeline.config import SAMPLE_SCHEMA, PipelineConfig
    from runs import run_lock

    root = str(tmp_path_factory.mktemp("cli-runs"))
    args = [
        "run",
        "--root",
        root,
        "--data",
        small_digits,
        "--schema",
        SAMPLE_SCHEMA,
        "--epochs",
        "3",
        "--accuracy-threshold",
        "0.2",
        "--min-class-recall",
        "0",
        "--explanations",
        "0",  # the report's misclassified images are still recorded; test_explanations.py reads explanations
    ]  # 3 epochs: a model that may miss a class
    first = StartedCommand([*args, "--progress", "json"])  # forked (StartedCommand), the second as users start it
    metadata_path = PipelineConfig(root=root, data=small_digits).metadata_path
    while not run_lock.held(metadata_path):  # the first run has started (it holds the lock for its whole run)
        assert first.running(), first.wait().stderr[-3000:]
        time.sleep(0.05)
    second = subprocess.Popen(
        [IMAGEPIPE, *args, "--no-cache"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    json_run = first.wait(timeout=900)
    out, err = second.communicate(timeout=900)
    text_run = subprocess.CompletedProcess(second.args, second.returncode, out, err)

    drifted = tmp_path_factory.mktemp("drifted") / "data"
    shutil.copytree(small_digits, drifted)
    for n in range(12):  # a class the curated schema does not know
        write(drifted / "letter-x" / f"x-{n}.png", image_bytes("PNG", size=(32, 32), mode="L", seed=n))
    failed = run_imagepipe("run", "--root", root, "--data", str(drifted), "--schema", SAMPLE_SCHEMA, "--epochs", "3")
    return {
        "root": root,
        "metadata_path": metadata_path,
        "json": json_run,
        "text": text_run,
        "failed": failed,
        "events": [json.loads(line) for line in json_run.stdout.splitlines() if line.startswith("{")],
    }
