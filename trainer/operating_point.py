"""The operating point and the calibration of a single-label model, chosen on held-out train data
(trainer/holdout.py). Plain NumPy.

A class-weighted loss moves the decision boundary to an arbitrary point of each class's ROC curve; nothing in
training moves it back. So after training:
  1. per-class logit offsets o (for two classes, a threshold) are chosen on the held-out predictions: among the
     rules that meet what is asked (by default the gate's: accuracy at least --accuracy-threshold, every class's
     recall at least --min-class-recall; `--operating-point 'CLASS>=R'` adds a class's own floor), the one with
     the highest balanced accuracy; when none meets it, the closest one, and a one-line reason. Coordinate ascent:
     each class's offset in turn, over the points where some held-out image's decision flips, a few rounds (as
     scikit-learn's TunedThresholdClassifierCV does for a threshold, for each class).
  2. a temperature T is fitted on the shifted logits by the held-out negative log-likelihood (Guo et al., 2017:
     temperature scaling), so the top probability of the deployed decision means what it says; the expected
     calibration error is measured before and after.
The model then outputs softmax((logits + o) / T): the trainer folds both into its last layer
(task.py), so the SavedModel, TFLite, ONNX, Core ML and `imagepipe predict` decide alike.
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

AUTO, ARGMAX = "auto", "argmax"
MAX_CLASSES = 100  # offsets are searched up to this many classes (a round costs classes^2 x held-out images)
CANDIDATES = 64  # offsets tried for a class in a round, besides the flips of its own images
ROUNDS = 3
ECE_BINS = 15
TEMPERATURE_RANGE = (0.25, 20.0)
# Fewer held-out mistakes than this say nothing of how sure the model should be: a nearly separable held-out set
# drives the fitted temperature towards 0 (every probability 1.0), so the temperature stays 1.
MIN_MISTAKES = 5
RULE_HELP = (
    "how the model decides (chosen on held-out train data): auto (meet --accuracy-threshold and --min-class-recall, "
    "then the best balanced accuracy), argmax (the head's own), or class recall floors as 'CLASS>=R[,CLASS>=R]' "
    "(e.g. 'ok>=0.98': at most 2%% of ok images called something else), default {default}"
)


def parse(rule: str) -> Dict[str, float]:
    """'auto' and 'argmax': {}; 'a>=0.9,b>=0.5': {"a": 0.9, "b": 0.5}. ValueError in one line otherwise."""
    if rule in (AUTO, ARGMAX):
        return {}
    floors = {}
    for part in rule.split(","):
        name, sep, value = part.strip().rpartition(">=")
        try:
            recall = float(value) if sep and name.strip() else math.nan
        except ValueError:
            recall = math.nan
        if not 0.0 <= recall <= 1.0:
            raise ValueError(
                f"--operating-point {rule!r}: use auto, argmax, or class recall floors as 'CLASS>=R' "
                "(R from 0 to 1, several joined by commas)"
            )
        floors[name.strip()] = recall
    return floors


def check(rule: str) -> bool:
    try:
        parse(rule)
        return True
    except ValueError:
        return False


def log_probabilities(probabilities: np.ndarray) -> np.ndarray:
    return np.log(np.clip(probabilities.astype(np.float64), 1e-12, 1.0))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def figures(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> Dict:
    """Accuracy, balanced accuracy and each class's recall (None: no held-out image of it)."""
    n = np.bincount(labels, minlength=num_classes)[:num_classes]
    right = np.bincount(labels[predicted == labels], minlength=num_classes)[:num_classes]
    recall = [float(r / k) if k else None for r, k in zip(right, n)]
    present = [r for r in recall if r is not None]
    return {
        "accuracy": float(right.sum() / max(1, len(labels))),
        "balanced_accuracy": float(np.mean(present)) if present else 0.0,
        "recall": recall,
    }


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """Top-label ECE: the gap between confidence and accuracy, averaged over equal-width confidence bins by their
    share of the images."""
    if not len(labels):
        return 0.0
    confidence = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == labels
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    gap = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            gap += inside.mean() * abs(right[inside].mean() - confidence[inside].mean())
    return float(gap)


def reliability(probabilities: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> List[Dict]:
    """The reliability diagram's bins: [{"confidence", "accuracy", "count"}] of the bins with images."""
    confidence = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == labels
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    return [
        {
            "confidence": float(confidence[which == b].mean()),
            "accuracy": float(right[which == b].mean()),
            "count": int((which == b).sum()),
        }
        for b in range(bins)
        if (which == b).any()
    ]


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T > 0 minimising the mean negative log-likelihood of softmax(logits / T): golden-section search over
    log T (the likelihood is unimodal in it)."""
    if not len(labels):
        return 1.0

    def nll(log_t: float) -> float:
        scaled = logits / math.exp(log_t)
        scaled = scaled - scaled.max(axis=1, keepdims=True)
        lse = np.log(np.exp(scaled).sum(axis=1))
        return float((lse - scaled[np.arange(len(labels)), labels]).mean())

    lo, hi = math.log(TEMPERATURE_RANGE[0]), math.log(TEMPERATURE_RANGE[1])
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll(b)
    return float(math.exp((lo + hi) / 2))


def _score(right: np.ndarray, n: np.ndarray, floors: np.ndarray, accuracy_floor: float) -> Tuple[float, float, float]:
    """(minus the shortfall from what is asked, balanced accuracy, accuracy): compared as a tuple, higher is better.
    right: [classes, candidates] held-out images right, n: [classes] images."""
    present = n > 0
    recall = right[present] / n[present, None]
    accuracy = right.sum(axis=0) / max(1, n.sum())
    shortfall = np.maximum(0.0, accuracy_floor - accuracy)
    if present.any():
        shortfall = np.maximum(shortfall, (floors[present, None] - recall).max(axis=0))
    return -np.round(shortfall, 9), recall.mean(axis=0) if present.any() else accuracy * 0, accuracy


def _best(scores) -> int:
    """The index of the best candidate (the first of equals)."""
    order = np.lexsort((-np.arange(len(scores[0])), scores[2], scores[1], scores[0]))
    return int(order[-1])


def search_offsets(
    logits: np.ndarray, labels: np.ndarray, floors: np.ndarray, accuracy_floor: float, rounds: int = ROUNDS
) -> np.ndarray:
    """Per-class offsets by coordinate ascent on _score (a class's offset moves only on a strict improvement)."""
    count, classes = logits.shape
    offsets = np.zeros(classes)
    onehot = np.eye(classes)[labels]  # [images, classes]
    n = onehot.sum(axis=0)

    def current() -> Tuple:
        predicted = (logits + offsets).argmax(axis=1)
        right = (onehot * (predicted == labels)[:, None]).sum(axis=0)[:, None]
        return tuple(s[0] for s in _score(right, n, floors, accuracy_floor))

    for _ in range(rounds):
        moved = False
        for c in range(classes):
            others = logits + offsets
            others[:, c] = -np.inf
            best_other = others.argmax(axis=1)
            margin = others[np.arange(count), best_other] - logits[:, c]  # c wins when its offset exceeds this
            candidates = _candidates(margin, labels == c, offsets[c])
            wins = candidates[None, :] > margin[:, None]  # [images, candidates]
            correct = np.where(wins, (labels == c)[:, None], (labels == best_other)[:, None])
            right = onehot.T @ correct  # [classes, candidates]
            scores = _score(right, n, floors, accuracy_floor)
            best = _best(scores)
            if tuple(s[best] for s in scores) > current():
                offsets[c] = candidates[best]
                moved = True
        if not moved:
            break
    return offsets - offsets.mean()


def _candidates(margin: np.ndarray, own: np.ndarray, now: float) -> np.ndarray:
    """Offsets worth trying: just past each of the class's own images' margins and CANDIDATES quantiles of all,
    and the current one."""
    points = np.unique(np.concatenate([margin[own], np.quantile(margin, np.linspace(0, 1, CANDIDATES))]))
    if len(points) > 4 * CANDIDATES:  # a large class: its own images' quantiles
        points = np.unique(np.quantile(points, np.linspace(0, 1, 4 * CANDIDATES)))
    return np.concatenate([points + 1e-6, [points[0] - 1.0, now]])


def recall_floors(rule: str, class_names: Sequence[str], recall_floor: float) -> np.ndarray:
    """Each class's recall floor: --min-class-recall, or the rule's own floor for the class where it is higher."""
    own = parse(rule)
    unknown = sorted(set(own) - set(class_names))
    if unknown:
        raise ValueError(
            f"--operating-point names {', '.join(repr(u) for u in unknown)}: not one of the classes "
            f"({', '.join(class_names[:10])}{', ...' if len(class_names) > 10 else ''})"
        )
    return np.array([max(recall_floor, own.get(name, 0.0)) for name in class_names])


def _offsets(logits, labels, floors, accuracy_floor: float, rule: str, imbalanced: bool, class_names) -> tuple:
    """(the logit offsets, why they are the argmax's when a search was wanted but cannot run, else "")."""
    classes = len(class_names)
    argmax_meets = not _shortfalls(figures(labels, logits.argmax(axis=1), classes), floors, accuracy_floor, class_names)
    if rule == ARGMAX or (rule == AUTO and not imbalanced and argmax_meets):
        return np.zeros(classes), ""
    if not len(labels):
        return np.zeros(classes), "no held-out images: the head's argmax"
    if classes > MAX_CLASSES:
        return np.zeros(classes), f"over {MAX_CLASSES} classes: the head's argmax"
    return search_offsets(logits, labels, floors, accuracy_floor), ""


def choose(
    probabilities: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    rule: str,
    accuracy_floor: float,
    recall_floor: float,
    imbalanced: bool = True,
) -> Dict:
    """The decision rule and temperature for held-out (probabilities [images, classes], labels [images]), as
    training.json records it: {rule, offsets, temperature, meets, reason, asked, held_out: {argmax, chosen,
    ece_before, ece_after, reliability_before, reliability_after, images}}.

    `auto` searches offsets when the classes were weighed (`imbalanced`: the loss moved the boundary) or when the
    argmax misses what is asked; on balanced classes whose argmax meets it, the argmax stays (a search would only
    fit the held-out set's noise: on the digits it moved a class by one image of 287)."""
    classes = len(class_names)
    labels = np.asarray(labels).astype(np.int64)
    known = (labels >= 0) & (labels < classes)
    probabilities, labels = probabilities[known], labels[known]
    logits = log_probabilities(probabilities)
    floors = recall_floors(rule, class_names, recall_floor)
    offsets, reason = _offsets(logits, labels, floors, accuracy_floor, rule, imbalanced, class_names)
    shifted = logits + offsets
    mistakes = int((shifted.argmax(axis=1) != labels).sum()) if len(labels) else 0
    temperature = fit_temperature(shifted, labels) if mistakes >= MIN_MISTAKES else 1.0
    calibrated = softmax(shifted / temperature)
    before, after = figures(labels, logits.argmax(axis=1), classes), figures(labels, shifted.argmax(axis=1), classes)
    shortfalls = _shortfalls(after, floors, accuracy_floor, class_names)
    if shortfalls and not reason:
        reason = "nothing meets what is asked on held-out train data; closest: " + shortfalls
    return {
        "rule": rule,
        "asked": {
            "accuracy": accuracy_floor,
            "recall": {name: float(f) for name, f in zip(class_names, floors) if f > 0},
        },
        "offsets": [float(o) for o in offsets],
        "temperature": temperature,
        "calibrated": mistakes >= MIN_MISTAKES,  # else too few held-out mistakes to fit a temperature on
        "meets": not shortfalls,
        "reason": reason,
        "held_out": {
            "images": int(len(labels)),
            "argmax": before,
            "chosen": after,
            "ece_before": expected_calibration_error(probabilities, labels),
            "ece_after": expected_calibration_error(calibrated, labels),
            "reliability_before": reliability(probabilities, labels),
            "reliability_after": reliability(calibrated, labels),
            "precision_recall": precision_recall(calibrated, labels, shifted.argmax(axis=1), class_names),
        },
    }


PR_CURVE_CLASSES = 20  # the classes whose precision-recall curves training.json keeps: the weakest by chosen recall


def precision_recall(
    probabilities: np.ndarray, labels: np.ndarray, predicted: np.ndarray, class_names: Sequence[str]
) -> Dict[str, Dict]:
    """Each class's one-against-the-rest precision-recall curve on held-out images, its probability thresholded at
    THRESHOLD_GRID's points, and where the chosen rule puts it: {name: {"curve": [[recall, precision], ...],
    "chosen": [recall, precision]}} for up to PR_CURVE_CLASSES classes with held-out images, the lowest chosen
    recall first (the report draws them)."""
    found = {}
    for j, name in enumerate(class_names):
        actual = labels == j
        if not actual.any():
            continue
        curve = []
        for t in THRESHOLD_GRID[1:]:
            given = probabilities[:, j] >= t
            if given.any():
                curve.append(
                    [round(float((given & actual).sum() / actual.sum()), 4), round(float(actual[given].mean()), 4)]
                )
        chosen = predicted == j
        found[name] = {
            "curve": curve,
            "chosen": [
                round(float((chosen & actual).sum() / actual.sum()), 4),
                round(float(actual[chosen].mean()), 4) if chosen.any() else 0.0,
            ],
        }
    weakest = sorted(found, key=lambda name: (found[name]["chosen"][0], name))[:PR_CURVE_CLASSES]
    return {name: found[name] for name in weakest}


def _shortfalls(chosen: Dict, floors: np.ndarray, accuracy_floor: float, class_names: Sequence[str]) -> str:
    """What the chosen rule misses on held-out data, the worst first, in a phrase ('' when nothing)."""
    missed = []
    if chosen["accuracy"] < accuracy_floor:
        missed.append((accuracy_floor - chosen["accuracy"], f"accuracy {chosen['accuracy']:.3f} < {accuracy_floor:g}"))
    for name, recall, floor in zip(class_names, chosen["recall"], floors):
        if recall is not None and recall < floor:
            missed.append((floor - recall, f"{name}'s recall {recall:.3f} < {floor:g}"))
    return ", ".join(text for _, text in sorted(missed, key=lambda m: -m[0]))


# The probability thresholds a multi-label model's labels are judged at: the Evaluator's curves
# (components/evaluator/views.py) and the Trainer's choice share them, so its figures are read off the same points.
THRESHOLD_GRID = [round(i / 40, 3) for i in range(40)] + [0.99]  # 0, 0.025, ..., 0.975, 0.99
LABEL_RULE = "best F1 on held-out train images"


def label_thresholds(probabilities: np.ndarray, hot: np.ndarray, names: Sequence[str]) -> Dict:
    """A multi-label model's threshold per label, chosen on held-out (probabilities and multi-hot labels
    [images, labels]): the grid point of best F1 (ties: the lower), among those that do not give the label to every
    image (they tell nothing); 0.5 for a label no held-out image has. As training.json and label_thresholds.json
    record it: {rule, thresholds, held_out: {images, per_label: {name: {threshold, f1, precision, recall, support}}}}."""
    thresholds, per_label = {}, {}
    images = len(hot)
    for j, name in enumerate(names):
        actual = hot[:, j] > 0.5
        best = None
        for t in THRESHOLD_GRID[1:]:
            given = probabilities[:, j] >= t
            if images and given.all():
                continue
            tp = int((given & actual).sum())
            precision = tp / given.sum() if given.any() else None
            recall = tp / actual.sum() if actual.any() else None
            f1 = 2 * tp / (given.sum() + actual.sum()) if actual.any() else None
            if f1 is not None and (best is None or f1 > best["f1"]):
                best = {"threshold": t, "f1": f1, "precision": precision, "recall": recall}
        chosen = best or {"threshold": 0.5, "f1": None, "precision": None, "recall": None}
        thresholds[name] = chosen["threshold"]
        per_label[name] = {**chosen, "support": int(actual.sum())}
    return {"rule": LABEL_RULE, "thresholds": thresholds, "held_out": {"images": images, "per_label": per_label}}


def fold(kernel: np.ndarray, bias: np.ndarray, offsets: Sequence[float], temperature: float):
    """The last layer's weights that output softmax((logits + offsets) / temperature)."""
    return kernel / temperature, (bias + np.asarray(offsets, dtype=bias.dtype)) / temperature


def describe(record: Optional[Dict]) -> str:
    """A phrase for the summary: 'operating point auto on 412 held-out train images (balanced accuracy 0.744 at
    argmax -> 0.861); calibrated: T 1.42, ECE 0.121 -> 0.034'."""
    if not record or "held_out" not in record:
        return ""
    held = record["held_out"]
    if "thresholds" in record:  # multi-label: a threshold per label
        scores = [m["f1"] for m in held["per_label"].values() if m.get("f1") is not None]
        return f"label thresholds: {record['rule']} ({held['images']:,} images" + (
            f", mean F1 {sum(scores) / len(scores):.3f})" if scores else ")"
        )
    if not held["images"]:
        return f"operating point: {record.get('reason') or 'argmax'}"
    held_images = f"{held['images']:,}"
    text = (
        f"operating point {record['rule']} on {record.get('chosen_on') or f'{held_images} held-out train images'}"
        " (balanced accuracy "
        f"{held['argmax']['balanced_accuracy']:.3f} at argmax -> {held['chosen']['balanced_accuracy']:.3f}); "
        + (
            f"calibrated: T {record['temperature']:.2f}, ECE {held['ece_before']:.3f} -> {held['ece_after']:.3f}"
            if record.get("calibrated")
            else f"not calibrated (fewer than {MIN_MISTAKES} held-out mistakes), ECE {held['ece_before']:.3f}"
        )
    )
    return text + (f"; {record['reason']}" if record.get("reason") else "")
