"""The data health checks that are plain arithmetic: poor images, outliers in feature space, drift in
feature space, and the thresholds that turn findings into problems (fail or warn, like the gate).
"""

from typing import Dict, List, Optional

import numpy as np

import settings
from components.health import Limits
from trainer import class_balance

# Poor images, on the resized pixels (0..255): nearly one colour, nearly black, nearly white; and a
# file much wider than tall (or the reverse), which the square model input squashes.
BLANK_STD = 4.0
DARK_MEAN = 25.0
BRIGHT_MEAN = 230.0
MAX_ASPECT = 4.0
# Far from every class: the distance to the nearest class centre (standardised features) beyond Tukey's
# far-out fence, the third quartile plus this many interquartile ranges (a median + 6 MAD rule flagged
# 8% of the generated shapes' images, on a skewed distribution; this fence, 2%).
OUTLIER_IQRS = 3.0


def poor_image_reasons(mean: float, std: float, height: int, width: int) -> List[str]:
    reasons = []
    if std < BLANK_STD:
        reasons.append(f"nearly blank (pixel standard deviation {std:.1f})")
    if mean < DARK_MEAN:
        reasons.append(f"very dark (mean {mean:.0f} of 255)")
    elif mean > BRIGHT_MEAN:
        reasons.append(f"very bright (mean {mean:.0f} of 255)")
    if height > 0 and width > 0 and max(height, width) / min(height, width) > MAX_ASPECT:
        reasons.append(f"extreme aspect ratio ({width}x{height})")
    return reasons


def far_from_every_class(z: np.ndarray, labels: np.ndarray, train: np.ndarray) -> np.ndarray:
    """Per image, whether it is far from every class centre of the training split (z: standardised,
    reduced features [n, d]); and the distances. (DataHealth streams the same: nearest_centre batch by batch,
    then far_out.)"""
    classes = np.unique(labels[train])
    centres = np.stack([z[train & (labels == c)].mean(axis=0) for c in classes])
    nearest = nearest_centre(z, centres)
    return far_out(nearest), nearest


def nearest_centre(z: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Each row's distance to the nearest of the centres (both standardised features)."""
    # |z - c|^2 = |z|^2 - 2 z.c + |c|^2: [n, classes] at most, never [n, classes, d].
    squared = (z**2).sum(axis=1)[:, None] - 2 * z @ centres.T + (centres**2).sum(axis=1)[None]
    return np.sqrt(np.maximum(squared, 0).min(axis=1))


def far_out(nearest: np.ndarray) -> np.ndarray:
    """Whether each distance is beyond the fence of all of them (a distance not measured, NaN: never)."""
    limit = fence(nearest)
    if limit is None:
        return np.zeros(len(nearest), bool)
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(nearest, nan=-np.inf) > limit


def fence(nearest: np.ndarray) -> Optional[float]:
    """The far-out fence of these distances (those not measured, NaN, left out; None: none measured)."""
    measured = nearest[np.isfinite(nearest)]
    if not len(measured):
        return None
    q1, q3 = np.percentile(measured, [25, 75])
    return float(q3 + OUTLIER_IQRS * (q3 - q1))


def feature_drift(reference: Optional[Dict], current: Optional[Dict]) -> Optional[float]:
    """How far the new training features moved from the blessed model's: the root mean square, over the
    features, of the shift of each feature's mean in units of its spread then (a standardised mean
    difference). About 0.05 between two samples of one set; a new camera or lighting moves it far more."""
    if not reference or not current or len(reference["mean"]) != len(current["mean"]):
        return None
    shift = (np.asarray(current["mean"]) - np.asarray(reference["mean"])) / (np.asarray(reference["std"]) + 1e-6)
    return float(np.sqrt(np.mean(shift**2)))


def problems(
    near_duplicate_eval: Optional[float], label_issues: Optional[float], drift: Optional[float], limits: Limits
) -> List[Dict]:
    """Each check over its threshold: {check, value, threshold, option, text}."""
    found = []
    for name, value, setting, what, share in (
        (
            "near-duplicates",
            near_duplicate_eval,
            "max_eval_near_duplicates",
            "of the eval examples have a near-duplicate in train",
            True,
        ),
        ("label issues", label_issues, "max_label_issues", "of the examples look mislabelled", True),
        (
            "feature drift",
            drift,
            "max_feature_drift",
            "shift of the features from the last blessed model's data",
            False,
        ),
    ):
        limit = getattr(limits, setting)
        if value is None or value <= limit + 1e-9:
            continue
        option = settings.option(Limits.__dataclass_fields__[setting])
        shown, bound = (f"{value:.1%}", f"{limit:.1%}") if share else (f"{value:.3f}", f"{limit:.3f}")
        found.append(
            {
                "check": name,
                "value": round(value, 6),
                "threshold": limit,
                "option": option,
                "text": f"{shown} {what} (more than {bound}; {option})",
            }
        )
    return found


def class_warnings(per_split: Dict[str, Dict[str, int]]) -> List[Dict]:
    """Warnings about the class mix (trainer/class_balance.py), which stop nothing: a train split imbalanced past
    WARN_RATIO, and the classes with too few eval images for the Evaluator to judge them."""
    found = []
    train, evaluation = per_split.get("train", {}), per_split.get("eval", {})
    ratio = class_balance.imbalance_ratio(train)
    if ratio is not None and ratio > class_balance.WARN_RATIO:
        found.append(
            {
                "check": "class imbalance",
                "value": round(ratio, 2),
                "threshold": class_balance.WARN_RATIO,
                "text": f"the train split is imbalanced {ratio:.0f}:1 ({class_balance.describe_mix(train)}): "
                "training balances the classes, but more images of the rare ones help most",
            }
        )
    few = sorted(
        (evaluation.get(label, 0), label)
        for label, n in train.items()
        if n and evaluation.get(label, 0) < class_balance.MIN_EVAL_EXAMPLES
    )
    if few:
        named = ", ".join(f"{label} ({n})" for n, label in few[:10]) + (
            f" and {len(few) - 10} more" if len(few) > 10 else ""
        )
        found.append(
            {
                "check": "few eval images",
                "value": len(few),
                "threshold": class_balance.MIN_EVAL_EXAMPLES,
                "classes": [label for _, label in few],
                "text": f"{len(few)} class{'es' if len(few) > 1 else ''} with fewer than "
                f"{class_balance.MIN_EVAL_EXAMPLES} eval images, too few to judge the model on: "
                f"{named}; the Evaluator does not hold them to --min-class-recall: add eval images",
            }
        )
    return found


def describe(found: List[Dict]) -> str:
    return (
        "data health found "
        + "; ".join(p["text"] for p in found)
        + "; review them (the report lists each), or raise the limits, or run with --gate warn"
    )
