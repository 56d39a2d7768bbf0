"""Imbalanced image sets, generated with no network, presplit (`<out>/train/<class>/`, `<out>/eval/<class>/`).

  defect    one scene kind, as on an inspection line: photo-like JPEGs (crops of scikit-learn's sample photos,
            colour jittered, 160-240 px), `ok`, or `defect` with a small dark scratch or blotch covering
            1-4% of the image. The train split has `minority` defects among `majority` ok images; the eval
            split has the same mix (a quarter of the train counts).
  longtail  bench/shapes.py's ten shapes with a long tail in train (from `head` images of the first class down to
            `tail` of the last, geometric) and a balanced eval split (`eval_per_class` each).

Deterministic for a seed. bench/imbalance_benchmark.py trains on them; the tests make small ones.

    python -m bench.imbalanced --out bench/out/defect-2 --kind defect --majority 1600 --minority 32
"""

import argparse
import io
import os
from typing import Dict

import numpy as np
from PIL import Image, ImageDraw


def _scene(rng: np.random.Generator, sources) -> Image.Image:
    src = sources[int(rng.integers(len(sources)))]
    h, w = src.shape[:2]
    ch, cw = int(rng.integers(h // 2, h + 1)), int(rng.integers(w // 2, w + 1))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = np.clip(
        src[y : y + ch, x : x + cw].astype(np.float32) * rng.uniform(0.8, 1.2, size=3) + rng.uniform(-15, 15), 0, 255
    ).astype(np.uint8)
    side = int(rng.integers(160, 241))
    return Image.fromarray(crop).resize((side, side), Image.BILINEAR)


def _defect(image: Image.Image, rng: np.random.Generator) -> None:
    """A dark scratch or blotch over 1-4% of the image, somewhere in its middle 80%."""
    side = image.size[0]
    area = rng.uniform(0.01, 0.04) * side * side
    cx, cy = rng.uniform(0.1 * side, 0.9 * side, size=2)
    shade = tuple(int(v) for v in rng.integers(0, 40, size=3))
    draw = ImageDraw.Draw(image)
    if rng.random() < 0.5:  # a blotch: an ellipse of that area
        a = np.sqrt(area / np.pi) * rng.uniform(0.7, 1.4)
        b = area / (np.pi * a)
        draw.ellipse((cx - a, cy - b, cx + a, cy + b), fill=shade)
    else:  # a scratch: a thick line of that area
        width = max(2, int(rng.uniform(0.02, 0.04) * side))
        length = area / width
        angle = rng.uniform(0, np.pi)
        dx, dy = np.cos(angle) * length / 2, np.sin(angle) * length / 2
        draw.line((cx - dx, cy - dy, cx + dx, cy + dy), fill=shade, width=width)


def _jpeg(image: Image.Image, rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=int(rng.integers(80, 96)))
    return out.getvalue()


def defect_image(defective: bool, rng: np.random.Generator, sources) -> bytes:
    image = _scene(rng, sources)
    if defective:
        _defect(image, rng)
    return _jpeg(image, rng)


def _write_set(out: str, counts: Dict[str, Dict[str, int]], make, seed: int) -> str:
    """Writes {split: {class: n}} images made by make(class, rng) under `out` (whole or not at all)."""
    from storage.user_files import write_folder

    def build(tmp: str) -> None:
        for s, (split, per_class) in enumerate(sorted(counts.items())):
            for c, (name, n) in enumerate(sorted(per_class.items())):
                os.makedirs(os.path.join(tmp, split, name))
                for i in range(n):
                    with open(os.path.join(tmp, split, name, f"{i:05d}.jpg"), "wb") as f:
                        f.write(make(name, np.random.default_rng([seed, s, c, i])))

    return write_folder(out, build, "--out")  # kept once complete; never over a folder of the user's files


def make_defect_set(out: str, majority: int, minority: int, seed: int = 0) -> str:
    """`ok` and `defect` images: train majority/minority, eval a quarter of each (at least one)."""
    from sklearn.datasets import load_sample_images

    sources = load_sample_images().images
    counts = {
        "train": {"ok": majority, "defect": minority},
        "eval": {"ok": max(1, majority // 4), "defect": max(1, minority // 2)},
    }
    return _write_set(out, counts, lambda name, rng: defect_image(name == "defect", rng, sources), seed)


def longtail_counts(head: int, tail: int, classes: int = 10):
    """Train counts from `head` down to `tail`, geometric over the classes."""
    ratio = (tail / head) ** (1 / (classes - 1))
    return [max(1, round(head * ratio**i)) for i in range(classes)]


def make_longtail_set(out: str, head: int = 800, tail: int = 12, eval_per_class: int = 40, seed: int = 0) -> str:
    from sklearn.datasets import load_sample_images

    from bench import shapes

    sources = load_sample_images().images
    train = dict(zip(shapes.CLASSES, longtail_counts(head, tail, len(shapes.CLASSES))))
    counts = {"train": train, "eval": {name: eval_per_class for name in shapes.CLASSES}}
    return _write_set(out, counts, lambda name, rng: shapes.image(name, rng, sources), seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", choices=("defect", "longtail"), default="defect")
    parser.add_argument("--majority", type=int, default=1600, help="defect: ok images in train")
    parser.add_argument("--minority", type=int, default=32, help="defect: defect images in train")
    parser.add_argument("--head", type=int, default=800, help="longtail: train images of the largest class")
    parser.add_argument("--tail", type=int, default=12, help="longtail: train images of the smallest class")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.kind == "defect":
        print(make_defect_set(args.out, args.majority, args.minority, args.seed))
    else:
        print(make_longtail_set(args.out, args.head, args.tail, seed=args.seed))


if __name__ == "__main__":
    main()
