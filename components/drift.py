"""Drift between the data of the latest blessed model and a run's new data.

ImageExampleGen writes a profile of what it ingested (profile.json beside the
examples): examples per class, per format, and per power-of-two bin of the
original width and height. The Evaluator keeps the profile of the data it judged
a model on with that model's blessing (components/evaluator/executor.py), so the
next run's validation gate can compare its data with the blessed model's: the
class mix, the size and format distributions (L-infinity distance between the two
shares, as TFDV's drift comparator measures categorical features), and the drop in
the example count. TFX's ExampleValidator cannot do this in 1.16: it passes no
previous statistics, so drift comparators in a schema are ignored.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from settings import fraction, option, setting


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Largest accepted L-infinity distances, and the largest accepted drop of the example count: each declared
    once, here (settings.setting()), as the pipeline settings and the gate's parameters that set them."""

    max_class_drift: float = setting(0.2, "class mix (default {default})", check=fraction("1: no check"))
    max_size_drift: float = setting(
        0.3, "image width and height, in power-of-two bins (default {default})", check=fraction("1: no check")
    )
    max_format_drift: float = setting(0.3, "JPEG/PNG/GIF/BMP mix (default {default})", check=fraction("1: no check"))
    max_count_drop: float = setting(
        0.5,
        "largest accepted drop of the example count, as a fraction (default {default})",
        check=fraction("1: no check"),
    )


# Each compared distribution of the profile: (profile key, what the user reads, the threshold's setting).
CHECKS = (
    ("classes", "class mix", "max_class_drift"),
    ("width", "image width", "max_size_drift"),
    ("height", "image height", "max_size_drift"),
    ("formats", "image format", "max_format_drift"),
)


def _option(name: str) -> str:
    """The option that sets a threshold, as its declaration names it (settings.option)."""
    return option(Thresholds.__dataclass_fields__[name])


def check(
    reference: Optional[Dict[str, Any]], current: Optional[Dict[str, Any]], limits: Thresholds, has_baseline: bool
) -> Dict[str, Any]:
    """The drift result: compare()'s, or {"skipped": why} when there is nothing to compare with."""
    if not has_baseline:
        return {"skipped": "no blessed model yet"}
    if reference is None:
        return {"skipped": "the last blessed model's blessing keeps no data profile (made by an older version)"}
    if current is None:
        return {"skipped": "this run's examples have no data profile (ingested by an older version)"}
    return compare(reference, current, limits)


def make_profile(
    examples: int,
    examples_per_split_and_class: Dict[str, Dict[str, int]],
    formats: Dict[str, int],
    sizes: List[list],
    examples_per_split: Optional[Dict[str, int]] = None,
) -> Dict[str, Any]:
    """The profile of one ingestion (all splits): the examples (images: a multi-label image counts once, under
    every label it has in `classes`; per split too), counts per class, format, width bin and height bin."""
    classes: Dict[str, int] = {}
    for per_class in examples_per_split_and_class.values():
        for label, n in per_class.items():
            classes[label] = classes.get(label, 0) + n
    width: Dict[str, int] = {}
    height: Dict[str, int] = {}
    for _split, side, bucket, n in sizes:
        counts = width if side == "width" else height
        counts[bucket] = counts.get(bucket, 0) + n
    return {
        "examples": examples,
        "classes": dict(sorted(classes.items())),
        **({"examples_per_split": dict(sorted(examples_per_split.items()))} if examples_per_split else {}),
        # per split too: the Evaluator judges each class on its eval count (components/evaluator/executor.py)
        "classes_per_split": {
            split: dict(sorted(per_class.items())) for split, per_class in sorted(examples_per_split_and_class.items())
        },
        "formats": dict(sorted(formats.items())),
        "width": width,
        "height": height,
    }


def shares(counts: Dict[str, int]) -> Dict[str, float]:
    total = sum(counts.values())
    return {k: n / total for k, n in counts.items()} if total else {}


def linf(a: Dict[str, float], b: Dict[str, float]) -> Tuple[float, str]:
    """The L-infinity distance between two share maps, and the key where it is reached."""
    keys = sorted(set(a) | set(b))
    if not keys:
        return 0.0, ""
    worst = max(keys, key=lambda k: abs(a.get(k, 0.0) - b.get(k, 0.0)))
    return abs(a.get(worst, 0.0) - b.get(worst, 0.0)), worst


def compare(reference: Dict[str, Any], current: Dict[str, Any], limits: Thresholds) -> Dict[str, Any]:
    """Every comparison, each with its distance, threshold and both distributions (for the report)."""
    checks = []
    for key, title, name in CHECKS:
        ref, cur = reference.get(key) or {}, current.get(key) or {}
        if key == "classes":
            # A class added or removed is a class change, reported apart (and handled by the Evaluator);
            # the mix is compared over the classes both have, so a new class alone is not drift.
            common = set(ref) & set(cur)
            ref, cur = ({k: n for k, n in counts.items() if k in common} for counts in (ref, cur))
        if not ref or not cur:
            continue  # a profile without this distribution (an older version's): nothing to compare
        distance, at = linf(shares(ref), shares(cur))
        threshold = getattr(limits, name)
        checks.append(
            {
                "feature": title,
                "metric": "L-infinity",
                "distance": round(distance, 4),
                "option": _option(name),
                "threshold": threshold,
                "at": at,
                "drifted": distance > threshold + 1e-9,
                "reference": ref,
                "current": cur,
            }
        )
    before, now = reference.get("examples", 0), current.get("examples", 0)
    drop = 1 - now / before if before else 0.0
    checks.append(
        {
            "feature": "example count",
            "metric": "drop",
            "distance": round(max(drop, 0.0), 4),
            "option": _option("max_count_drop"),
            "threshold": limits.max_count_drop,
            "at": "",
            "drifted": drop > limits.max_count_drop + 1e-9,
            "reference": {"examples": before},
            "current": {"examples": now},
        }
    )
    ref_classes, cur_classes = set(reference.get("classes") or {}), set(current.get("classes") or {})
    return {
        "checks": checks,
        "classes_added": sorted(cur_classes - ref_classes),
        "classes_removed": sorted(ref_classes - cur_classes),
    }


def short_check(check: Dict[str, Any]) -> str:
    """The feature and the distance, for a one-line verdict."""
    if check["metric"] == "drop":
        return f"example count dropped by {check['distance']:.0%} since the last blessed model (> {check['threshold']:.0%})"
    return (
        f"{check['feature']} drifted from the last blessed model's data (L-infinity {check['distance']:.3f} > "
        f"{check['threshold']:.3f})"
    )


def describe_check(check: Dict[str, Any]) -> str:
    """One line naming the feature, the distance and the threshold, and where the shift is largest."""
    if check["metric"] == "drop":
        return (
            f"example count dropped by {check['distance']:.0%} ({check['reference']['examples']:,} -> "
            f"{check['current']['examples']:,}), more than the {check['threshold']:.0%} allowed"
        )
    ref, cur = shares(check["reference"]), shares(check["current"])
    at = check["at"]
    return (
        f"{check['feature']}: L-infinity distance {check['distance']:.3f} > {check['threshold']:.3f} "
        f"(largest at {at!r}: {ref.get(at, 0.0):.1%} -> {cur.get(at, 0.0):.1%})"
    )


def describe_classes(result: Dict[str, Any]) -> Optional[str]:
    parts = []
    if result.get("classes_added"):
        parts.append("classes added since the last blessed model: " + ", ".join(map(repr, result["classes_added"])))
    if result.get("classes_removed"):
        parts.append("classes removed: " + ", ".join(map(repr, result["classes_removed"])))
    return "; ".join(parts) or None
