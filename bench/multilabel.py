"""A generated multi-label image set: photo backgrounds with 0 to 3 of five planted objects, with no network.

Each image is a 96x96 JPEG: a crop of one of scikit-learn's sample photos (low contrast, as in shapes.py) with
each object planted in its own quadrant (60-85% of its side), at a random colour and tilt. The labels are the objects planted.
Their frequencies differ (LABEL_RATES: 'star' is in about one image in ten), and some images hold none. Written as
`<out>/images/NNNNN.jpg` with three descriptions of the same labels:

    labels.csv      a manifest: path,labels (labels separated by ';', empty when none) and split
    import.jsonl    an AutoML multi-label import file (classificationAnnotations, ml_use)
    import.csv      an AutoML multi-label CSV import: ML_USE,PATH[,LABEL...]

Deterministic for a given seed. The split is given (TRAINING 70%, VALIDATION 20%, TEST 10%), so a benchmark's
plain Keras script and the pipeline see the same images.

    python -m bench.multilabel --out bench/out/multilabel --images 2000
"""

import argparse
import csv
import io
import json
import os

import numpy as np
from PIL import Image, ImageDraw

from bench import shapes

SIZE = shapes.SIZE
LABELS = ("circle", "square", "triangle", "cross", "star")
# An easy kind for tests: solid squares whose colour is the label, which the small CNN learns in a few epochs.
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 215, 40),
    "magenta": (220, 40, 220),
}
LABEL_RATES = (0.5, 0.4, 0.3, 0.2, 0.1)  # the chance that each object is planted in an image
MAX_OBJECTS = 3
SPLITS = (("TRAINING", 0.7), ("VALIDATION", 0.2), ("TEST", 0.1))


def labels_for(rng: np.random.Generator, names=LABELS):
    """The objects planted in one image: each with its LABEL_RATES chance, at most MAX_OBJECTS (the rarest kept)."""
    chosen = [name for name, rate in zip(names, LABEL_RATES) if rng.random() < rate]
    return sorted(chosen[-MAX_OBJECTS:])


def image(labels, rng: np.random.Generator, sources) -> bytes:
    src = sources[int(rng.integers(len(sources)))]
    side = int(rng.integers(120, min(src.shape[:2])))
    y, x = int(rng.integers(0, src.shape[0] - side)), int(rng.integers(0, src.shape[1] - side))
    crop = src[y : y + side, x : x + side].astype(np.float32) * rng.uniform(0.6, 1.3, size=3)
    crop = crop * 0.3 + crop.mean(axis=(0, 1)) * 0.7
    picture = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR)
    quadrants = rng.permutation(4)[: len(labels)]
    half = SIZE // 2
    for name, quadrant in zip(labels, quadrants):
        canvas = Image.new("RGBA", (SIZE, SIZE), (0, 0, 0, 0))
        if name in COLOURS:
            ImageDraw.Draw(canvas).rectangle((10, 10, 80, 80), fill=COLOURS[name])
        else:
            shapes._shape(ImageDraw.Draw(canvas), name, rng)
        drawn = canvas.crop(canvas.getbbox())  # the object alone, scaled to most of its quadrant
        scale = rng.uniform(0.6, 0.85) * half / max(drawn.size)
        drawn = drawn.resize((max(1, round(drawn.width * scale)), max(1, round(drawn.height * scale))), Image.BILINEAR)
        x = half * (quadrant % 2) + int(rng.integers(0, half - drawn.width + 1))
        y = half * (quadrant // 2) + int(rng.integers(0, half - drawn.height + 1))
        picture.paste(drawn, (x, y), drawn)
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=int(rng.integers(80, 95)))
    return out.getvalue()


def make_multilabel(out: str, images: int = 2000, seed: int = 0, kind: str = "shapes") -> str:
    """Writes the set to `out` (a new or empty folder; one made before is kept); returns `out`. kind "colours":
    coloured squares (COLOURS) instead of the shapes, an easy set for tests."""
    from sklearn.datasets import load_sample_images

    from storage.user_files import write_folder

    def build(tmp: str) -> None:
        sources = load_sample_images().images
        os.makedirs(os.path.join(tmp, "images"))
        rows = []
        for n in range(images):
            rng = np.random.default_rng([seed, n])
            labels = labels_for(rng, tuple(COLOURS) if kind == "colours" else LABELS)
            rel = f"images/{n:05d}.jpg"
            with open(os.path.join(tmp, rel), "wb") as f:
                f.write(image(labels, rng, sources))
            share = (n * 0.6180339887) % 1.0  # an even spread of splits, the same for any count
            ml_use = next(
                name for name, bound in zip((s for s, _ in SPLITS), np.cumsum([r for _, r in SPLITS])) if share < bound
            )
            rows.append((rel, labels, ml_use))
        split_name = {"TRAINING": "train", "VALIDATION": "eval", "TEST": "test"}
        with open(os.path.join(tmp, "labels.csv"), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "labels", "split"])
            writer.writerows([rel, ";".join(labels), split_name[ml_use]] for rel, labels, ml_use in rows)
        with open(os.path.join(tmp, "import.jsonl"), "w") as f:
            for rel, labels, ml_use in rows:
                f.write(
                    json.dumps(
                        {
                            "imageGcsUri": rel,
                            "classificationAnnotations": [{"displayName": name} for name in labels],
                            "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": ml_use.lower()},
                        }
                    )
                    + "\n"
                )
        with open(os.path.join(tmp, "import.csv"), "w", newline="") as f:
            csv.writer(f).writerows([ml_use, rel, *labels] for rel, labels, ml_use in rows)

    return write_folder(out, build, "--out")


def read_rows(folder: str):
    """[(path, [labels], split)] of a set make_multilabel wrote, from its labels.csv."""
    with open(os.path.join(folder, "labels.csv"), newline="") as f:
        return [
            (os.path.join(folder, r["path"]), [n for n in r["labels"].split(";") if n], r["split"])
            for r in csv.DictReader(f)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=("shapes", "colours"), default="shapes")
    args = parser.parse_args()
    print(make_multilabel(args.out, args.images, args.seed, args.kind))


if __name__ == "__main__":
    main()
