"""Generates full-resolution camera-like photos (12 MP JPEGs by default), with no network.

Phone cameras write 4032x3024 JPEGs of ~2-4 MB; what makes them that large is
detail and sensor noise, which a smoothly upscaled picture lacks (it compresses
to a few hundred KB and would flatter every measurement). So each photo is a
random crop of one of scikit-learn's sample photos (a class each), upscaled,
colour-jittered, with grain added from a noise tile at a random offset.
Deterministic for a given seed; files are written to `<out>/<class>/<n>.jpg`.

    python -m bench.photos --out bench/out/photos-500 --files 500
"""

import argparse
import io
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import List, Tuple

import numpy as np
from PIL import Image

from storage.user_files import write_folder

CLASSES = ("china", "flower")
PHONE = (4032, 3024)  # 12 MP, 4:3, as most phone cameras write them
_TILE = 512  # side of the grain tile


def photo(
    rng: np.random.Generator, source: np.ndarray, size: Tuple[int, int] = PHONE, fmt: str = "JPEG", quality: int = 90
) -> bytes:
    """One encoded photo of `size` (width, height) from a random crop of `source`."""
    h, w = source.shape[:2]
    ch, cw = int(rng.integers(h // 2, h + 1)), int(rng.integers(w // 2, w + 1))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = Image.fromarray(source[y : y + ch, x : x + cw])
    if rng.integers(2):
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    big = np.asarray(crop.resize(size, Image.BILINEAR), dtype=np.int16)
    gain = rng.uniform(0.8, 1.2, size=3)
    grain = rng.integers(-12, 13, size=(_TILE, _TILE, 1), dtype=np.int16)
    reps = (-(-size[1] // _TILE), -(-size[0] // _TILE), 1)
    noise = np.tile(grain, reps)[: size[1], : size[0]]
    pixels = np.clip(big * gain + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **({"quality": quality} if fmt == "JPEG" else {"compress_level": 1}))
    return out.getvalue()


def _write_chunk(args) -> int:
    root, indices, seed, size = args
    from sklearn.datasets import load_sample_images

    sources = load_sample_images().images
    for n in indices:
        rng = np.random.default_rng([seed, n])
        label = CLASSES[n % len(CLASSES)]
        with open(os.path.join(root, label, f"{n:06d}.jpg"), "wb") as f:
            f.write(photo(rng, sources[CLASSES.index(label)], size))
    return len(indices)


def build(out: str, files: int, seed: int = 0, workers: int = 2, size: Tuple[int, int] = PHONE) -> dict:
    """Writes `files` photos to `out` (replacing it; built under a temporary name) and describes them."""
    made = {}

    def build_in(tmp: str) -> None:  # never over a folder of the user's files (storage/user_files.write_folder)
        for label in CLASSES:
            os.makedirs(os.path.join(tmp, label))
        chunks: List[list] = [list(range(i, files, workers * 4)) for i in range(min(files, workers * 4))]
        with ProcessPoolExecutor(workers) as pool:
            made["written"] = sum(pool.map(_write_chunk, [(tmp, c, seed, size) for c in chunks]))

    write_folder(out, build_in, "--out", replace=True)
    written = made["written"]
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    return {"root": out, "files": written, "bytes": total, "width": size[0], "height": size[1]}


def ensure(out: str, files: int, seed: int = 0, size: Tuple[int, int] = PHONE) -> dict:
    """The corpus at `out`, built only if it is missing or has another file count."""
    have = sum(len([f for f in fs if not f.startswith(".")]) for _, _, fs in os.walk(out)) if os.path.isdir(out) else 0
    if have != files:
        return build(out, files, seed, size=size)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    return {"root": out, "files": files, "bytes": total, "width": size[0], "height": size[1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/out/photos")
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="4032x3024", help="WIDTHxHEIGHT")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    print(build(args.out, args.files, args.seed, size=(width, height)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
