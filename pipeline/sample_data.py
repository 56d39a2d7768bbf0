"""The sample dataset: scikit-learn's bundled digits written as image files.

1,797 real 8x8 handwritten digits (10 classes), upscaled to 32x32 and written as
`<out>/<digit>/digit-NNNN.{jpg,png}` (two thirds JPEG, one third PNG), so the
default run and the tests use real image files and need no network.
"""

import os

import numpy as np
from PIL import Image

from storage.user_files import write_folder

SIZE = 32


def make_digits(out: str, option: str = "--out") -> dict:
    """Writes the dataset to `out` unless it is already complete; returns counts. A folder that holds anything
    else is refused (storage/user_files.write_folder): nothing of the user's is ever deleted."""
    return _describe(write_folder(out, _write_digits, option))


def _write_digits(folder: str) -> None:
    from sklearn.datasets import load_digits  # scikit-learn (~1.7 s): pipeline/preflight.py imports this module

    digits = load_digits()
    for label in range(10):
        os.makedirs(os.path.join(folder, str(label)))
    for i, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        # 0..16 ink levels -> 0..255, black digits on white like scanned paper.
        gray = (255 - pixels * (255 / 16)).clip(0, 255).astype(np.uint8)
        image = Image.fromarray(gray, mode="L").resize((SIZE, SIZE), Image.BICUBIC)
        fmt = "png" if i % 3 == 2 else "jpg"
        path = os.path.join(folder, str(label), f"digit-{i:04d}.{fmt}")
        image.save(path, quality=95) if fmt == "jpg" else image.save(path)


def _describe(out: str) -> dict:
    files = [f for _, _, fs in os.walk(out) for f in fs if not f.startswith(".")]
    return {"path": out, "files": len(files), "classes": len([d for d in os.listdir(out) if not d.startswith(".")])}
