"""Transfer learning that pays for the backbone once: the features step against the code before it.

    python -m bench.features_benchmark                          # 2,000 and 8,000 photos, vs --baseline
    python -m bench.features_benchmark --sizes 500 --no-baseline

For each size, a photo-like corpus (bench/corpus.py: 300-500 px JPEGs, two classes) is written as
span-1 (the size) and span-2 (span-1 and 10% more images). `imagepipe run --model mobilenet_v2
--image-size 160 --epochs 10 --patience 10` (ten frozen epochs, none cut short) runs in a fresh process
and a fresh --root: the baseline commit on span-1 (checked out in a git worktree, imported ahead of
this tree: both in one benchmark, with the same machine noise), then this code on span-1 and, in the
same root (so the same features cache), on span-2. Nothing downloads: the backbone is MobileNetV2 with
random weights whose BatchNorm statistics are calibrated on corpus images (bench/backbones.py), given
to both versions as --weights.

Reported: the Trainer's seconds and the features step's, per frozen epoch the mean epoch time from
training.json, the Evaluator's accuracy, the features computed and reused, and the run's peak RSS.
"""

import json
import os
import shutil
import statistics
import sys
from typing import Dict, List

from bench import corpus
from bench.photo_benchmark import (
    OUT,
    PROJECT,
    baseline_tree,
    comparison_parser,
    printed_saved_table,
    run_pipeline,
    save_results,
)

ARGS = ["--model", "mobilenet_v2", "--image-size", "160", "--patience", "10", "--accuracy-threshold", "0"]


def spans(size: int) -> Dict[str, str]:
    """span-1 with `size` images and span-2 with 10% more (hard links into one corpus of 1.1x size)."""
    base = os.path.join(OUT, f"features-{size}")
    done = os.path.join(base, ".complete")
    found = {name: os.path.join(base, name) for name in ("span-1", "span-2")}
    if os.path.exists(done):
        return found
    shutil.rmtree(base, ignore_errors=True)
    whole = corpus.build(os.path.join(base, "all"), int(size * 1.1), bad_files=False)["root"]
    for name, share in (("span-1", size), ("span-2", None)):
        for label in sorted(name for name in os.listdir(whole) if not name.startswith(".")):  # not corpus marks
            os.makedirs(os.path.join(found[name], label))
            names = sorted(os.listdir(os.path.join(whole, label)))
            for n in names[: share // 2 if share else None]:
                os.link(os.path.join(whole, label, n), os.path.join(found[name], label, n))
    open(done, "w").close()
    return found


def weights_file(images_dir: str) -> str:
    import numpy as np
    from PIL import Image

    from bench.backbones import calibrated_weights

    path = os.path.join(OUT, "mobilenet_v2_160_calibrated.weights.h5")
    if not os.path.exists(path):
        files = [os.path.join(d, f) for d, _, fs in os.walk(images_dir) for f in sorted(fs)][::7][:64]
        images = np.stack([np.asarray(Image.open(f).convert("RGB").resize((160, 160))) for f in files])
        calibrated_weights("mobilenet_v2", 160, images, path)
    return path


def measured(result: dict, **labels) -> dict:
    trainer = result["details"].get("Trainer") or {}
    epochs = []
    if trainer.get("model_run"):
        with open(os.path.join(trainer["model_run"], "training.json")) as f:
            epochs = [e["seconds"] for e in json.load(f)["epochs"] if e["phase"] == "frozen backbone"]
    features = result["details"].get("BackboneFeatures") or {}
    seconds = {name: s for name, (s, _) in result["components"].items()}
    return {
        **labels,
        "status": result["status"],
        "error": result["error"],
        "accuracy": result["accuracy"],
        "trainer_s": seconds.get("Trainer"),
        "features_s": seconds.get("BackboneFeatures"),
        "epochs": len(epochs),
        "epoch_s": statistics.median(epochs) if epochs else None,
        "computed": features.get("computed"),
        "reused": features.get("reused"),
        "peak_rss_gb": result["peak_rss_gb"],
        "wall_s": result["wall_seconds"],
    }


def table(rows: List[dict]) -> List[str]:
    lines = [
        "| images | code | data | Trainer s | features s | Trainer + features s | frozen epochs | s per frozen "
        "epoch | features computed / reused | eval accuracy | peak RSS GB |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        total = (r["trainer_s"] or 0) + (r["features_s"] or 0)
        cache = "-" if r["computed"] is None else f"{r['computed']:,} / {r['reused']:,}"
        accuracy = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
        lines.append(
            f"| {r['images']:,} | {r['code']} | {r['span']} | {r['trainer_s'] or '-'} | {r['features_s'] or '-'} "
            f"| {total:.1f} | {r['epochs']} | {r['epoch_s'] if r['epoch_s'] is not None else '-'} | {cache} "
            f"| {accuracy} | {r['peak_rss_gb']} |"
        )
    for size in sorted({r["images"] for r in rows}):
        new = {r["span"]: r for r in rows if r["images"] == size and r["code"] == "this"}
        old = next((r for r in rows if r["images"] == size and r["code"] != "this"), None)
        first, second = new.get("span-1"), new.get("span-2")
        if first and old and old["trainer_s"]:
            lines.append(
                f"\n{size:,} images: Trainer + features {old['trainer_s'] / (first['trainer_s'] + first['features_s']):.1f}x "
                f"faster than the baseline's Trainer; a head epoch {old['epoch_s'] / first['epoch_s']:.0f}x faster "
                f"than a frozen-backbone epoch; accuracy {first['accuracy'] - old['accuracy']:+.4f}"
            )
        if first and second and second["features_s"]:
            lines.append(
                f"{size:,} images: span-2 (+10%) features step {first['features_s'] / second['features_s']:.1f}x "
                f"faster than span-1's"
            )
    return lines


def main(argv=None) -> int:
    parser = comparison_parser(
        __doc__,
        "bcac092",
        "commit to compare with (the code before the features step)",
        10,
        os.path.join(OUT, "features_benchmark.json"),
    )
    parser.add_argument("--sizes", default="2000,8000")
    parser.add_argument("--rss-limit-gb", type=float, default=18.0)
    args = parser.parse_args(argv)
    if printed_saved_table(args, table):
        return 0
    rows = []
    limit = int(args.rss_limit_gb * 2**30)
    for size in (int(s) for s in args.sizes.split(",")):
        data = spans(size)
        extra = ARGS + ["--weights", weights_file(data["span-1"])]
        if not args.no_baseline:
            root = os.path.join(OUT, "features-runs", f"{size}-baseline")
            result = run_pipeline(baseline_tree(args.baseline), data["span-1"], root, args.epochs, limit, extra)
            rows.append(measured(result, images=size, code=f"baseline {args.baseline}", span="span-1"))
            print(json.dumps(rows[-1]), file=sys.stderr)
            shutil.rmtree(root, ignore_errors=True)
        root = os.path.join(OUT, "features-runs", f"{size}-this")
        for span in ("span-1", "span-2"):  # one root: span-2's run finds span-1's features in the cache
            result = run_pipeline(PROJECT, data[span], root, args.epochs, limit, extra, keep_root=span == "span-2")
            rows.append(measured(result, images=size, code="this", span=span))
            print(json.dumps(rows[-1]), file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
        save_results(rows, args.out)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
