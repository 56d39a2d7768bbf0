"""Generated sets whose class is decided by something small and known, for checking explanations (saliency maps).

  patch     the class is a small planted patch (a pattern of its own: checks, stripes or a ring), 12 px at a random
            place of a 64 px photo crop; boxes.json gives each image's patch as [x0, y0, x1, y1]
  shortcut  two classes of plain photo crops, told apart only by a small mark in the top-left corner of every image
            of one class (a shortcut a model takes, as a watermark or a ruler): boxes.json gives the mark's box

With --scale K, every size is K times larger (a 192 px photo crop with a 36 px patch at --scale 3: photo-sized,
where --model auto takes the pretrained backbone; bench/transfer_benchmark.py's `marked` set).

Written as class folders, `<out>/images/<class>/NNNNN.png` (PNG: the patch keeps its pixels; --data <out>/images),
with <out>/boxes.json ({"<class>/NNNNN.png": [x0, y0, x1, y1]}). Deterministic for a given seed.

    python -m bench.planted --out bench/out/patch --kind patch --per-class 200
"""

import argparse
import io
import json
import os

import numpy as np
from PIL import Image

SIZE = 64
PATCH = 12
PATCH_CLASSES = ("checks", "stripes", "ring")
SHORTCUT_CLASSES = ("marked", "plain")
MARK = 8  # the shortcut's corner mark, px


def _background(rng: np.random.Generator, sources, size: int = SIZE) -> np.ndarray:
    src = sources[int(rng.integers(len(sources)))]
    side = int(rng.integers(80, min(src.shape[:2])))
    y, x = int(rng.integers(0, src.shape[0] - side)), int(rng.integers(0, src.shape[1] - side))
    crop = Image.fromarray(src[y : y + side, x : x + side]).resize((size, size), Image.BILINEAR)
    return np.asarray(crop, np.float32) * rng.uniform(0.7, 1.2, size=3)


def _pattern(name: str) -> np.ndarray:
    """A PATCH x PATCH pattern in 0..1 (1: bright), the same in every image of the class."""
    yy, xx = np.mgrid[0:PATCH, 0:PATCH]
    if name == "checks":
        return ((yy // 3 + xx // 3) % 2).astype(np.float32)
    if name == "stripes":
        return ((xx // 2) % 2).astype(np.float32)
    r = np.hypot(yy - (PATCH - 1) / 2, xx - (PATCH - 1) / 2)
    return ((r > 2.5) & (r < 5.0)).astype(np.float32)


def image(kind: str, name: str, rng: np.random.Generator, sources, scale: int = 1):
    """(PNG bytes, the box of what decides the class); every size `scale` times larger."""
    size, patch, mark = SIZE * scale, PATCH * scale, MARK * scale
    pixels = _background(rng, sources, size)
    if kind == "patch":
        x, y = (int(v) for v in rng.integers(0, size - patch + 1, size=2))
        pattern = np.kron(_pattern(name), np.ones((scale, scale), np.float32))[..., None]
        pixels[y : y + patch, x : x + patch] = pattern * 255.0 + (1 - pattern) * 0.0
        box = [x, y, x + patch, y + patch]
    else:
        box = [0, 0, mark, mark]
        if name == "marked":
            pixels[:mark, :mark] = (255.0, 0.0, 255.0)
    out = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    data = io.BytesIO()
    out.save(data, "PNG")
    return data.getvalue(), box


def make_planted(out: str, kind: str = "patch", per_class: int = 200, seed: int = 0, scale: int = 1) -> str:
    """Writes the set to `out` (a new or empty folder; one made before is kept); returns `out`."""
    from sklearn.datasets import load_sample_images

    from storage.user_files import write_folder

    def build(tmp: str) -> None:
        sources = load_sample_images().images
        boxes = {}
        for c, name in enumerate(PATCH_CLASSES if kind == "patch" else SHORTCUT_CLASSES):
            os.makedirs(os.path.join(tmp, "images", name))
            for n in range(per_class):
                data, box = image(kind, name, np.random.default_rng([seed, c, n]), sources, scale)
                rel = f"{name}/{n:05d}.png"
                with open(os.path.join(tmp, "images", rel), "wb") as f:
                    f.write(data)
                boxes[rel] = box
        with open(os.path.join(tmp, "boxes.json"), "w") as f:
            json.dump(boxes, f)

    return write_folder(out, build, "--out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", choices=("patch", "shortcut"), default="patch")
    parser.add_argument("--per-class", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=int, default=1, help="every size this many times larger")
    args = parser.parse_args()
    print(make_planted(args.out, args.kind, args.per_class, args.seed, args.scale))


if __name__ == "__main__":
    main()
