"""Data health on planted problems: flipped labels and near-duplicate copies found, and what the check costs.

    python -m bench.health_benchmark                         # digits, shapes (cnn), shapes (transfer)
    python -m bench.health_benchmark --sets digits --no-baseline
    python -m bench.health_benchmark --near-duplicates-only --baseline e702059   # ingestion alone, both codes

Each set is copied with problems planted on purpose (seeded): 5% of the images moved to another class's
folder (flipped labels), and copies of another 5% written beside their originals, resized (50-80%),
recompressed (JPEG quality 40-70) or cropped (3-6% a side), in turn. Then `imagepipe run` (fresh
process and root; --label-check on, 12 epochs at most) of this code, and of the --baseline commit
(before data health) on the same files. Reported:
  - label errors: how many flips are among the first 2x(flips) suspects of label_issues.csv;
  - near-duplicates: how many copies share a group with their original (near_duplicates.csv), and how
    many other images are in a group (the sets' own near-duplicates; the digits, 8x8 drawings scaled
    up, hold many);
  - cost: DataHealth's seconds, ImageExampleGen's seconds against the baseline's (the signatures),
    and the run's wall time against the baseline's, as a share of this run.
Sets: digits (the 1,797 of the sample), shapes (bench/shapes.py, 200 a class: 2,000), and shapes with
MobileNetV2 at 96 px (random weights, BatchNorm calibrated: nothing downloads), whose label check runs
on the features step's output.
"""

import csv
import glob
import io
import os
import shutil
import sys
from typing import Dict, List

import numpy as np
from PIL import Image

from bench import examplegen_package
from bench.photo_benchmark import (
    OUT,
    PROJECT,
    baseline_tree,
    comparison_parser,
    printed_saved_table,
    run_pipeline,
    save_results,
)

HERE = os.path.join(OUT, "health")
SHARE = 0.05  # of the images flipped, and of the images copied


def plant(source: str, out: str, seed: int = 0) -> Dict:
    """A copy of the class-folder set `source` with flipped labels and near-duplicate copies, made again at `out`
    (a folder this made before, or a new one: storage/user_files.write_folder); the truth."""
    from storage.user_files import write_folder

    truth: Dict = {}
    write_folder(out, lambda folder: truth.update(_plant(source, folder, seed)), "--out", replace=True)
    return truth


def _plant(source: str, out: str, seed: int) -> Dict:
    rng = np.random.default_rng(seed)
    classes = sorted(c for c in os.listdir(source) if not c.startswith("."))
    files = [(c, n) for c in classes for n in sorted(os.listdir(os.path.join(source, c))) if not n.startswith(".")]
    order = rng.permutation(len(files))
    count = int(len(files) * SHARE)
    flipped, copied = set(order[:count].tolist()), order[count : 2 * count].tolist()
    truth = {"images": len(files), "flips": {}, "copies": {}}
    for i, (label, name) in enumerate(files):
        given = (
            classes[(classes.index(label) + 1 + int(rng.integers(len(classes) - 1))) % len(classes)]
            if i in flipped
            else label
        )
        os.makedirs(os.path.join(out, given), exist_ok=True)
        shutil.copy(os.path.join(source, label, name), os.path.join(out, given, name))
        if i in flipped:
            truth["flips"][f"{given}/{name}"] = label
    for k, i in enumerate(copied):
        label, name = files[i]
        image = Image.open(os.path.join(source, label, name)).convert("RGB")
        w, h = image.size
        kind = ("resized", "recompressed", "cropped")[k % 3]
        if kind == "resized":
            scale = rng.uniform(0.5, 0.8)
            image = image.resize((max(8, round(w * scale)), max(8, round(h * scale))), Image.BILINEAR)
        elif kind == "cropped":
            dx, dy = round(w * rng.uniform(0.03, 0.06)), round(h * rng.uniform(0.03, 0.06))
            image = image.crop((dx, dy, w - dx, h - dy))
        data = io.BytesIO()
        image.save(data, "JPEG", quality=int(rng.integers(40, 71)) if kind == "recompressed" else 90)
        rel = f"{label}/copy-{k:05d}-{kind}.jpg"
        with open(os.path.join(out, rel), "wb") as f:
            f.write(data.getvalue())
        truth["copies"][rel] = f"{label}/{name}"
    return truth


def _csv(root: str, component: str, name: str) -> List[Dict]:
    found = sorted(glob.glob(os.path.join(root, "pipelines", "*", component, "*", "*", name)))
    if not found:
        return []
    with open(found[-1], newline="") as f:
        return list(csv.DictReader(f))


def score(root: str, truth: Dict) -> Dict:
    suspects = [row["path"] for row in _csv(root, "DataHealth", "label_issues.csv")]
    flips = truth["flips"]
    top = set(suspects[: 2 * len(flips)])
    found, others = near_score(_csv(root, "ImageExampleGen", "near_duplicates.csv"), truth)
    return {
        "flips": len(flips),
        "suspects": len(suspects),
        "flips_in_top": len(top & set(flips)),
        "copies": len(truth["copies"]),
        "copies_found": found,
        "other_images_flagged": others,
        "images": truth["images"] + len(truth["copies"]),
    }


def near_score(rows: List[Dict], truth: Dict):
    """(copies grouped with their original, other images in a group) from near_duplicates.csv's rows."""
    groups: Dict[str, set] = {}
    for row in rows:
        groups.setdefault(row["group"], set()).add(row["path"])
    group_of = {path: g for g, members in groups.items() for path in members}
    found = sum(
        1 for copy, original in truth["copies"].items() if copy in group_of and group_of[copy] == group_of.get(original)
    )
    planted = set(truth["copies"]) | set(truth["copies"].values())
    return found, sum(1 for path in group_of if path not in planted)


SETS = {
    "digits": {"extra": ["--label-check", "on"]},
    "shapes": {"extra": ["--label-check", "on"]},
    "shapes-transfer": {"extra": ["--model", "mobilenet_v2", "--image-size", "96"]},
}


def source_set(name: str) -> str:
    if name == "digits":
        from pipeline.sample_data import make_digits

        return make_digits(os.path.join(HERE, "digits-source"))["path"]
    from bench.shapes import make_shapes

    return make_shapes(os.path.join(HERE, "shapes-source"), per_class=200)


def weights_for(data: str) -> str:
    from bench.backbones import calibrated_weights

    path = os.path.join(HERE, "mobilenet_v2-96.weights.h5")
    if not os.path.exists(path):
        os.makedirs(HERE, exist_ok=True)
        files = sorted(glob.glob(os.path.join(data, "*", "*.jpg")))[::20][:64]
        images = np.stack([np.asarray(Image.open(f).convert("RGB").resize((96, 96))) for f in files])
        calibrated_weights("mobilenet_v2", 96, images, path)
    return path


def table(results: List[Dict]) -> List[str]:
    head = [
        "set",
        "images",
        "flips in top 2x",
        "copies found",
        "other images flagged",
        "DataHealth s",
        "ImageExampleGen s (baseline)",
        "run s (baseline)",
        "check's share of the run",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        s, this, base = r["score"], r["this"], r.get("baseline")
        health = this["components"].get("DataHealth", (0,))[0] + this["components"].get("DataHealthGate", (0,))[0]
        ingest = this["components"]["ImageExampleGen"][0]
        base_ingest = base["components"]["ImageExampleGen"][0] if base else None
        share = (health + max(0.0, ingest - base_ingest)) / this["wall_seconds"] if base else None
        lines.append(
            "| "
            + " | ".join(
                [
                    r["set"],
                    f"{s['images']:,}",
                    f"{s['flips_in_top']}/{s['flips']} ({s['flips_in_top'] / s['flips']:.0%})",
                    f"{s['copies_found']}/{s['copies']} ({s['copies_found'] / s['copies']:.0%})",
                    f"{s['other_images_flagged']} ({s['other_images_flagged'] / s['images']:.1%})",
                    f"{health:.1f}",
                    f"{ingest:.1f}" + (f" ({base_ingest:.1f})" if base else ""),
                    f"{this['wall_seconds']:.0f}" + (f" ({base['wall_seconds']:.0f})" if base else ""),
                    f"{share:.0%}" if share is not None else "-",
                ]
            )
            + " |"
        )
    return lines


_INGEST = """
import json, os, sys, time
sys.path.insert(0, {code!r})
os.chdir({code!r})  # ingestion's workers import from the working directory
from tfx.types import standard_artifacts
from tfx.utils import proto_utils
from {package}.component import ImageExampleGen, ImageIngestionReport
from {package} import executor
component = ImageExampleGen(input_base={data!r})
props = {{k: proto_utils.proto_to_json(v) if hasattr(v, "DESCRIPTOR") else v
          for k, v in component.exec_properties.items() if v is not None}}
examples, report = standard_artifacts.Examples(), ImageIngestionReport()
examples.uri, report.uri = os.path.join({out!r}, "examples"), os.path.join({out!r}, "report")
os.makedirs(examples.uri); os.makedirs(report.uri)
started = time.monotonic()
executor.Executor(executor.Executor.Context(tmp_dir={out!r})).Do({{}}, {{"examples": [examples], "report": [report]}},
                                                                 props)
print(json.dumps({{"seconds": time.monotonic() - started}}))
"""


def near_duplicates_only(names: List[str], codes: List[tuple]) -> int:
    """ImageExampleGen alone on each planted set, for each code (fresh processes): the copies found, the other
    images flagged, and the seconds: what the near-duplicate search finds, without training."""
    import json
    import subprocess

    print("| set | code | copies found | other images flagged | ImageExampleGen s |\n|---|---|---:|---:|---:|")
    for name in dict.fromkeys(n.split("-")[0] for n in names):
        data = os.path.join(HERE, f"{name}-planted")
        truth = plant(source_set(name), data)
        for code, code_dir in codes:
            out = os.path.join(HERE, "ingest", f"{name}-{code}")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _INGEST.format(code=code_dir, data=data, out=out, package=examplegen_package(code_dir)),
                ],
                capture_output=True,
                text=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            )
            if proc.returncode:
                raise RuntimeError(proc.stderr[-3000:])
            seconds = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
            with open(os.path.join(out, "report", "near_duplicates.csv"), newline="") as f:
                found, others = near_score(list(csv.DictReader(f)), truth)
            print(f"| {name} | {code} | {found}/{len(truth['copies'])} | {others} | {seconds:.1f} |", flush=True)
    return 0


def main(argv=None) -> int:
    parser = comparison_parser(__doc__, "a60a88b", "commit before data health", 12, os.path.join(HERE, "results.json"))
    parser.add_argument("--sets", default="digits,shapes,shapes-transfer")
    parser.add_argument(
        "--near-duplicates-only",
        action="store_true",
        help="run ImageExampleGen alone (this code and --baseline): the copies found, no training",
    )
    args = parser.parse_args(argv)
    if printed_saved_table(args, table):
        return 0
    if args.near_duplicates_only:
        return near_duplicates_only(
            args.sets.split(","),
            [("this", PROJECT)] + ([] if args.no_baseline else [(args.baseline, baseline_tree(args.baseline))]),
        )
    results = []
    for name in args.sets.split(","):
        data = os.path.join(HERE, f"{name.split('-')[0]}-planted")
        truth = plant(source_set(name), data)
        extra = list(SETS[name]["extra"])
        if "--model" in extra:
            extra += ["--weights", weights_for(data)]
        result = {"set": name}
        for code, code_dir in [("this", PROJECT)] + (
            [] if args.no_baseline else [("baseline", baseline_tree(args.baseline))]
        ):
            flags = extra if code == "this" else [a for a in extra if a not in ("--label-check", "on")]
            root = os.path.join(HERE, "runs", f"{name}-{code}")
            result[code] = run_pipeline(code_dir, data, root, args.epochs, 18 << 30, flags)
            print(f"{name} {code}: {result[code]['status']} in {result[code]['wall_seconds']} s", file=sys.stderr)
            if code == "this":
                result["score"] = score(root, truth)
        results.append(result)
        save_results(results, args.out)
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
