"""Builds a photo-like JPEG corpus for benchmarks, with no network.

Random crops, scales (300-500 px on the long side) and colour jitter of
scikit-learn's bundled sample photos, written as `<root>/<class>/<n>.jpg`, plus a
few bad files of the kinds real folders contain. Deterministic for a given seed.

    python -m bench.corpus --out bench/out/corpus --files 4000
"""

import argparse
import io
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

from storage.user_files import write_folder

CLASSES = ("china", "flower")


def _photo(rng: np.random.Generator, sources) -> bytes:
    src_index = int(rng.integers(len(sources)))
    src = sources[src_index]
    h, w = src.shape[:2]
    ch, cw = int(rng.integers(h // 2, h + 1)), int(rng.integers(w // 2, w + 1))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = src[y : y + ch, x : x + cw].astype(np.float32)
    gain = rng.uniform(0.7, 1.3, size=3)
    crop = np.clip(crop * gain + rng.uniform(-20, 20), 0, 255).astype(np.uint8)
    long_side = int(rng.integers(300, 501))
    scale = long_side / max(ch, cw)
    size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
    image = Image.fromarray(crop).resize(size, Image.BILINEAR)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=int(rng.integers(80, 96)))
    return out.getvalue()


def _write_chunk(args):
    root, start, stop, seed = args
    from sklearn.datasets import load_sample_images

    sources = load_sample_images().images
    for n in range(start, stop):
        rng = np.random.default_rng([seed, n])
        label = CLASSES[n % len(CLASSES)]
        path = os.path.join(root, label, f"{n:06d}.jpg")
        with open(path, "wb") as f:
            f.write(_photo(rng, [sources[CLASSES.index(label)]]))
    return stop - start


def _write_bad_files(root: str) -> int:
    """One of each kind of bad file the ExampleGen must quarantine; returns the count."""
    good = open(os.path.join(root, CLASSES[0], "000000.jpg"), "rb").read()
    png = io.BytesIO()
    Image.open(io.BytesIO(good)).save(png, "PNG")
    bad = {
        "empty.jpg": b"",
        "truncated.jpg": good[: len(good) // 2],
        "notes.jpg": b"this is not an image\n",
        "renamed_png.jpg": png.getvalue(),  # valid: a PNG with a .jpg name
        "webp_like.jpg": b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16,
    }
    for name, data in bad.items():
        with open(os.path.join(root, CLASSES[1], "bad_" + name), "wb") as f:
            f.write(data)
    return len(bad) - 1  # the renamed PNG is a good image


def build(out: str, files: int, seed: int = 0, workers: int = 2, bad_files: bool = True) -> dict:
    """Writes the corpus to `out` (replacing it) and returns its description.

    bad_files=False leaves out the bad files: the Keras loaders compared in the input
    benchmark crash on a single one (measured), so they get a clean copy.
    """
    made = {}

    def build_in(tmp: str) -> None:  # never a half-built corpus under the final name, nor one over the user's files
        for label in CLASSES:
            os.makedirs(os.path.join(tmp, label))
        step = max(1, files // (workers * 8))
        chunks = [(tmp, s, min(files, s + step), seed) for s in range(0, files, step)]
        with ProcessPoolExecutor(workers) as pool:
            made["written"] = sum(pool.map(_write_chunk, chunks))
        made["bad"] = _write_bad_files(tmp) if bad_files else 0

    write_folder(out, build_in, "--out", replace=True)
    written, bad = made["written"], made["bad"]
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    return {"root": out, "good_files": written + (1 if bad_files else 0), "bad_files": bad, "bytes": size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/out/corpus")
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    info = build(args.out, args.files, args.seed)
    print(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
