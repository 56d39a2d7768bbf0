"""A large, diverse photo-like image set, with no network: for the scale benchmark (bench/scale_benchmark.py).

Each image is 160-320 px a side (not square), a JPEG of quality 75-95, and belongs to one of ten classes, each a
kind of scene made from random parts: a smooth random background (low-frequency noise in a random palette) or a
crop of scikit-learn's sample photos, with the class's object drawn large (a disc, a ring, a box, a bar, a
triangle, a star, a cross, a checker, stripes or a blob) in its own random colours, scale, place and tilt, and
distractors (lines, small shapes of other classes). Not crops of two photos: no two images share a background.
Written as class folders, `<out>/<class>/<NNNNNNN>.jpg`, in parallel processes; deterministic for a seed.

    python -m bench.scale_set --out bench/out/scale-10000 --images 10000
"""

import argparse
import io
import math
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("disc", "ring", "box", "bar", "triangle", "star", "cross", "checker", "stripes", "blob")


def _background(rng: np.random.Generator, width: int, height: int, photos) -> Image.Image:
    if rng.random() < 0.3:  # a crop of a real photo, recoloured
        src = photos[int(rng.integers(len(photos)))]
        ch, cw = int(rng.integers(80, src.shape[0])), int(rng.integers(80, src.shape[1]))
        y, x = int(rng.integers(0, src.shape[0] - ch)), int(rng.integers(0, src.shape[1] - cw))
        crop = src[y : y + ch, x : x + cw].astype(np.float32) * rng.uniform(0.6, 1.3, size=3)
        return Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize((width, height), Image.BILINEAR)
    grid = rng.uniform(0, 1, size=(int(rng.integers(3, 9)), int(rng.integers(3, 9)), 1))
    palette = rng.uniform(0, 255, size=(2, 3))
    field = Image.fromarray((grid[..., 0] * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
    t = np.asarray(field, np.float32)[..., None] / 255.0
    pixels = palette[0] * (1 - t) + palette[1] * t + rng.normal(0, rng.uniform(2, 14), size=(height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _draw(draw: ImageDraw.ImageDraw, name: str, cx: float, cy: float, r: float, angle: float, fill, rng) -> None:
    def rotated(points):
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in points]

    box = (cx - r, cy - r, cx + r, cy + r)
    if name == "disc":
        draw.ellipse(box, fill=fill)
    elif name == "ring":
        draw.ellipse(box, outline=fill, width=max(3, int(r / 4)))
    elif name == "box":
        draw.polygon(rotated([(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]), fill=fill)
    elif name == "bar":
        draw.polygon(
            rotated([(cx - r, cy - r / 4), (cx + r, cy - r / 4), (cx + r, cy + r / 4), (cx - r, cy + r / 4)]), fill=fill
        )
    elif name == "triangle":
        draw.polygon(rotated([(cx, cy - r), (cx + r * 0.87, cy + r / 2), (cx - r * 0.87, cy + r / 2)]), fill=fill)
    elif name == "star":
        points = [
            (
                cx + (r if k % 2 == 0 else r * 0.4) * math.cos(math.pi * k / 5 - math.pi / 2),
                cy + (r if k % 2 == 0 else r * 0.4) * math.sin(math.pi * k / 5 - math.pi / 2),
            )
            for k in range(10)
        ]
        draw.polygon(rotated(points), fill=fill)
    elif name == "cross":
        w = r / 3
        for bar in (
            [(cx - r, cy - w), (cx + r, cy - w), (cx + r, cy + w), (cx - r, cy + w)],
            [(cx - w, cy - r), (cx + w, cy - r), (cx + w, cy + r), (cx - w, cy + r)],
        ):
            draw.polygon(rotated(bar), fill=fill)
    elif name == "checker":
        cells, step = 4, 2 * r / 4
        for i in range(cells):
            for j in range(cells):
                if (i + j) % 2 == 0:
                    x0, y0 = cx - r + i * step, cy - r + j * step
                    draw.polygon(
                        rotated([(x0, y0), (x0 + step, y0), (x0 + step, y0 + step), (x0, y0 + step)]), fill=fill
                    )
    elif name == "stripes":
        for k in range(5):
            y0 = cy - r + k * 2 * r / 5
            draw.polygon(rotated([(cx - r, y0), (cx + r, y0), (cx + r, y0 + r / 5), (cx - r, y0 + r / 5)]), fill=fill)
    else:  # blob: an irregular closed curve
        n = 12
        radii = r * rng.uniform(0.55, 1.0, size=n)
        draw.polygon(
            [
                (cx + radii[k] * math.cos(2 * math.pi * k / n), cy + radii[k] * math.sin(2 * math.pi * k / n))
                for k in range(n)
            ],
            fill=fill,
        )


def image(label: int, rng: np.random.Generator, photos) -> bytes:
    width, height = int(rng.integers(160, 321)), int(rng.integers(160, 321))
    picture = _background(rng, width, height, photos)
    draw = ImageDraw.Draw(picture)
    side = min(width, height)
    for _ in range(int(rng.integers(0, 3))):  # distractors: small shapes of any class, lines
        other = CLASSES[int(rng.integers(len(CLASSES)))]
        _draw(
            draw,
            other,
            rng.uniform(0, width),
            rng.uniform(0, height),
            side * rng.uniform(0.04, 0.08),
            rng.uniform(0, math.pi),
            tuple(int(v) for v in rng.integers(0, 256, 3)),
            rng,
        )
    r = side * rng.uniform(0.18, 0.32)
    _draw(
        draw,
        CLASSES[label],
        rng.uniform(r, width - r),
        rng.uniform(r, height - r),
        r,
        rng.uniform(-0.5, 0.5),
        tuple(int(v) for v in rng.integers(0, 256, 3)),
        rng,
    )
    if rng.random() < 0.5:
        ends = [tuple(float(v) for v in rng.uniform(0, max(width, height), 2)) for _ in range(2)]
        draw.line(ends, fill=tuple(int(v) for v in rng.integers(0, 256, 3)), width=int(rng.integers(1, 5)))
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=int(rng.integers(75, 96)))
    return out.getvalue()


def _write_range(args) -> int:
    out, start, stop, seed = args
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    for n in range(start, stop):
        rng = np.random.default_rng([seed, n])
        label = n % len(CLASSES)
        with open(os.path.join(out, CLASSES[label], f"{n:07d}.jpg"), "wb") as f:
            f.write(image(label, rng, photos))
    return stop - start


def make_scale_set(out: str, images: int, seed: int = 0, processes: int = 0) -> str:
    """Writes the set to `out` (a new or empty folder; one made before is kept); returns `out`."""
    from storage.user_files import write_folder

    def build(tmp: str) -> None:
        for name in CLASSES:
            os.makedirs(os.path.join(tmp, name))
        chunk = 2000
        jobs = [(tmp, start, min(start + chunk, images), seed) for start in range(0, images, chunk)]
        with ProcessPoolExecutor(processes or os.cpu_count() or 1) as pool:
            list(pool.map(_write_range, jobs))

    return write_folder(out, build, "--out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_scale_set(args.out, args.images, args.seed))


if __name__ == "__main__":
    main()
