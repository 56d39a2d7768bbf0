"""A harder generated image set than the digits: ten shapes on photo backgrounds, with no network.

Each image is a 96x96 JPEG: a random crop of one of scikit-learn's bundled sample photos (colour
jittered, contrast lowered), one shape of the image's class drawn at a random place, size, colour and
tilt (within 20 degrees of upright), and at most one distracting line. The classes differ only by
outline (a pentagon and a hexagon at 20 px are close): the small CNN the digits take to 0.99 stays
near 0.7 here. Written in class-folder order, `<out>/<class>/NNNNN.jpg`,
like the sets users bring. Deterministic for a given seed.

    python -m bench.shapes --out bench/out/shapes --per-class 500
"""

import argparse
import io
import math
import os

import numpy as np
from PIL import Image, ImageDraw

SIZE = 96
CLASSES = ("circle", "square", "triangle", "pentagon", "hexagon", "star", "cross", "ring", "diamond", "arrow")


def _polygon(sides: int, radius: float, angle: float, cx: float, cy: float, star: bool = False):
    points = []
    count = sides * 2 if star else sides
    for k in range(count):
        r = radius * (0.45 if star and k % 2 else 1.0)
        a = angle + 2 * math.pi * k / count
        points.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return points


def _rotate(points, angle: float, cx: float, cy: float):
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in points]


def _shape(draw: ImageDraw.ImageDraw, name: str, rng: np.random.Generator) -> None:
    radius = rng.uniform(18, 38)
    cx, cy = rng.uniform(radius, SIZE - radius, size=2)
    angle = rng.uniform(-0.35, 0.35)  # upright, within 20 degrees: orientation is part of each shape
    fill = tuple(int(v) for v in rng.integers(0, 256, size=3))
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if name == "circle":
        draw.ellipse(box, fill=fill)
    elif name == "ring":
        draw.ellipse(box, outline=fill, width=max(2, int(radius / 4)))
    elif name in ("square", "diamond"):
        # A diamond is a square stretched along one diagonal, then rotated.
        stretch = 1.0 if name == "square" else 1.6
        points = [
            (cx + radius * stretch * math.cos(a) * (1 if k % 2 == 0 else 1 / stretch), cy + radius * math.sin(a))
            for k, a in enumerate(math.pi / 4 + math.pi / 2 * np.arange(4))
        ]
        draw.polygon(_rotate(points, angle, cx, cy), fill=fill)
    elif name in ("triangle", "pentagon", "hexagon"):
        draw.polygon(_polygon({"triangle": 3, "pentagon": 5, "hexagon": 6}[name], radius, angle, cx, cy), fill=fill)
    elif name == "star":
        draw.polygon(_polygon(5, radius, angle, cx, cy, star=True), fill=fill)
    elif name == "cross":
        w = radius / 3
        bars = [
            [(cx - radius, cy - w), (cx + radius, cy - w), (cx + radius, cy + w), (cx - radius, cy + w)],
            [(cx - w, cy - radius), (cx + w, cy - radius), (cx + w, cy + radius), (cx - w, cy + radius)],
        ]
        for bar in bars:
            draw.polygon(_rotate(bar, angle, cx, cy), fill=fill)
    elif name == "arrow":
        w = radius / 3
        points = [
            (cx - radius, cy - w),
            (cx, cy - w),
            (cx, cy - 2 * w),
            (cx + radius, cy),
            (cx, cy + 2 * w),
            (cx, cy + w),
            (cx - radius, cy + w),
        ]
        draw.polygon(_rotate(points, angle, cx, cy), fill=fill)


def image(name: str, rng: np.random.Generator, sources) -> bytes:
    src = sources[int(rng.integers(len(sources)))]
    side = int(rng.integers(120, min(src.shape[:2])))
    y, x = int(rng.integers(0, src.shape[0] - side)), int(rng.integers(0, src.shape[1] - side))
    crop = src[y : y + side, x : x + side].astype(np.float32) * rng.uniform(0.6, 1.3, size=3)
    crop = crop * 0.3 + crop.mean(axis=(0, 1)) * 0.7  # a third of the photo's contrast: the shape stands out
    background = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR)
    draw = ImageDraw.Draw(background)
    for _ in range(int(rng.integers(0, 2))):  # distractors: lines across the picture
        ends = [tuple(float(v) for v in rng.uniform(0, SIZE, size=2)) for _ in range(2)]
        draw.line(ends, fill=tuple(int(v) for v in rng.integers(0, 256, size=3)), width=int(rng.integers(1, 4)))
    _shape(draw, name, rng)
    out = io.BytesIO()
    background.save(out, "JPEG", quality=int(rng.integers(75, 95)))
    return out.getvalue()


def make_shapes(out: str, per_class: int = 500, seed: int = 0) -> str:
    """Writes the set to `out` (a new or empty folder; one made before is kept); returns `out`."""
    from sklearn.datasets import load_sample_images

    from storage.user_files import write_folder

    def build(tmp: str) -> None:
        sources = load_sample_images().images
        for c, name in enumerate(CLASSES):
            os.makedirs(os.path.join(tmp, name))
            for n in range(per_class):
                with open(os.path.join(tmp, name, f"{n:05d}.jpg"), "wb") as f:
                    f.write(image(name, np.random.default_rng([seed, c, n]), sources))

    return write_folder(out, build, "--out")  # kept once complete; never over a folder of the user's files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-class", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_shapes(args.out, args.per_class, args.seed))


if __name__ == "__main__":
    main()
