"""Shared test helpers: real image files made in the test, and ways to run the real components."""

import io
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/ (photo generator)


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
