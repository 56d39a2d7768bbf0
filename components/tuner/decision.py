"""When the Tuner searches again, and when a run reuses the last search's best values.

A search is worth its cost when what it searched on has changed: another model, input size, backbone
weights or search space (the old values may not even apply), another trial budget, new or removed classes,
a class mix or training set that moved (the pipeline's --max-class-drift; a set that doubled or halved),
or backbone features that drifted (--max-feature-drift, as data health measures it). Otherwise the run
reuses the last search's best values and says whose they are.
"""

from typing import Any, Dict, NamedTuple, Optional

from components import drift
from components.health.checks import feature_drift

COUNT_RATIO = 2.0  # a training set this many times larger or smaller than the searched one is searched again


class Decision(NamedTuple):
    search: bool
    reason: str


def profile(
    hp,
    trials: int,
    pipeline: str,
    classes,
    train_counts: Dict[str, int],
    features: Optional[Dict],
    space,
    space_version: int,
) -> Dict[str, Any]:
    """What a search depends on, recorded with its results (search.json) and compared by decide()."""
    return {
        "pipeline": pipeline,
        "model": hp.model,
        "image_size": hp.image_size,
        "trials": int(trials),
        "space": list(space),
        "space_version": space_version,
        "features_fingerprint": (features or {}).get("fingerprint"),
        "classes": list(classes),
        "train_class_counts": dict(train_counts),
        "train_examples": int(sum(train_counts.values())),
        "feature_profile": (features or {}).get("profile"),
    }


def decide(
    mode: str,
    previous: Optional[Dict[str, Any]],
    current: Dict[str, Any],
    max_class_drift: float,
    max_feature_drift: float,
) -> Decision:
    if mode == "search":
        return Decision(True, "asked to search")
    if not previous:
        return Decision(True, "no earlier search in this pipeline")
    if previous.get("pipeline") != current["pipeline"]:
        return Decision(True, f"the last search was another pipeline's ({previous.get('pipeline')})")
    for key, what in (
        ("model", "the model"),
        ("image_size", "the image size"),
        ("space", "the search space"),
        ("space_version", "the search space's ranges"),
        ("features_fingerprint", "the backbone weights"),
        ("trials", "the number of trials"),
    ):
        if previous.get(key) != current[key]:
            return Decision(True, f"{what} changed ({previous.get(key)} -> {current[key]})")
    before, now = list(previous.get("classes") or []), current["classes"]
    if before != now:
        added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
        parts = ([f"added {', '.join(map(repr, added))}"] if added else []) + (
            [f"removed {', '.join(map(repr, removed))}"] if removed else []
        )
        return Decision(True, "the classes changed (" + ("; ".join(parts) or "another order") + ")")
    distance, at = drift.linf(
        drift.shares(previous.get("train_class_counts") or {}), drift.shares(current["train_class_counts"])
    )
    if distance > max_class_drift + 1e-9:
        return Decision(True, f"the class mix drifted (L-infinity {distance:.3f} > {max_class_drift:.3f}, at {at!r})")
    searched, examples = previous.get("train_examples") or 0, current["train_examples"]
    if searched and not 1 / COUNT_RATIO <= examples / searched <= COUNT_RATIO:
        return Decision(True, f"the training set changed size ({searched:,} -> {examples:,} examples)")
    if previous.get("feature_profile") and current.get("feature_profile"):
        shift = feature_drift(previous["feature_profile"], current["feature_profile"])
        if shift is not None and shift > max_feature_drift + 1e-9:
            return Decision(True, f"the backbone features drifted ({shift:.3f} > {max_feature_drift:.3f})")
    return Decision(False, "classes, class mix, set size and settings as when searched")
