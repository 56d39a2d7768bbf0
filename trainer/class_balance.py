"""Imbalanced classes: how imbalanced a split is, and what training and evaluation do about it. Plain Python.

A model is good only if it is good for every class. On a train split whose largest class has more than
IMBALANCED_RATIO times the images of its smallest:
  - the Trainer balances the loss (--class-balance: per-class loss weights, inverse frequency capped at
    MAX_WEIGHT, or class-balanced batches), and starts the output bias at the log of the class mix the loss
    sees;
  - early stopping, the kept epoch and the Tuner's objective follow balanced accuracy (the mean recall of the
    classes), not accuracy, which a model that calls everything the majority class scores well on;
  - the Evaluator compares the candidate with the last blessed model on balanced accuracy.
On every split, the Evaluator blesses only a model whose recall reaches --min-class-recall on each class with
at least MIN_EVAL_EXAMPLES eval images, and that finds at least one eval image of each class with at least
MIN_EVAL_TO_FIND; data health warns above WARN_RATIO and names the classes with fewer than MIN_EVAL_EXAMPLES.
"""

import math
from typing import Dict, List, Optional, Sequence

IMBALANCED_RATIO = 3.0
WARN_RATIO = 10.0
MIN_EVAL_EXAMPLES = 10  # fewer eval images say too little about a class's recall to judge it on
# ... but from this many on, a model that finds none of them is not blessed either (it misses the class).
MIN_EVAL_TO_FIND = 3
MIN_CLASS_RECALL = 0.5  # --min-class-recall's default
ACCURACY_THRESHOLD = 0.9  # --accuracy-threshold's default (the Evaluator's; the Trainer's operating point meets it)
MODES = ("auto", "weights", "sampling", "off")  # --class-balance
# A class's loss weight is at most this many times the weight the classes would have if they were all equal:
# a class of a handful of images otherwise gets weights in the hundreds, and its few images swing every step.
MAX_WEIGHT = 20.0


def imbalance_ratio(counts: Dict[str, int]) -> Optional[float]:
    """Largest class / smallest class, over the classes with images; None with fewer than two such classes."""
    present = [n for n in counts.values() if n > 0]
    return max(present) / min(present) if len(present) > 1 else None


def is_imbalanced(counts: Dict[str, int]) -> bool:
    ratio = imbalance_ratio(counts)
    return ratio is not None and ratio > IMBALANCED_RATIO


def describe_mix(counts: Dict[str, int], most: int = 4) -> str:
    """A split's class mix in a phrase: 'ok 1,600 (98.0%), defect 32 (2.0%)', the largest first."""
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = [f"{name} {n:,} ({n / total:.1%})" for name, n in ordered[:most]] if total else []
    if len(ordered) > most:
        rest = ordered[most:]
        shown.append(f"{len(rest)} more from {min(n for _, n in rest):,} to {max(n for _, n in rest):,}")
    return ", ".join(shown)


def loss_weights(counts: Sequence[int], cap: float = MAX_WEIGHT) -> List[float]:
    """Per-class loss weights: n / (k * count), Keras' 'balanced' recipe, at most `cap` (a class with no training
    image gets 0: there is nothing to weigh). On balanced classes every weight is 1."""
    present = [n for n in counts if n > 0]
    total, k = sum(present), len(present)
    return [min(cap, total / (k * n)) if n > 0 else 0.0 for n in counts]


def effective_mix(counts: Sequence[int], weights: Optional[Sequence[float]] = None) -> List[float]:
    """The class shares the training loss sees: the counts, times the loss weights when there are any."""
    weighted = [n * (w if weights is not None else 1.0) for n, w in zip(counts, weights or [1.0] * len(counts))]
    total = sum(weighted)
    return [w / total for w in weighted] if total else [1.0 / len(counts)] * len(counts)


def initial_bias(mix: Sequence[float]) -> List[float]:
    """The classifier's starting bias: the log of the class shares its loss sees, so that the first steps do not
    spend themselves learning the class mix (Karpathy's 'init well'; the Keras imbalanced-data tutorial). A
    class without any share gets a large negative bias instead of log(0)."""
    return [math.log(p) if p > 0 else -20.0 for p in mix]


def sampling_shares(counts: Sequence[int], cap: float = MAX_WEIGHT) -> List[float]:
    """Class-balanced batches: the share of each class in a batch, equal shares where the cap allows (a class
    is drawn at most `cap` times as often as its count alone would draw it)."""
    return effective_mix(counts, loss_weights(counts, cap))


# What training follows (trainer/epochs.py, early stopping, the Tuner's objective): Keras' names of the held-out
# metrics (trainer/holdout.py; Keras calls its validation data's metrics val_*).
ACCURACY, BALANCED_ACCURACY = "val_sparse_categorical_accuracy", "val_balanced_accuracy"


# Multi-label training follows the macro-averaged area under the precision-recall curve of its labels
# (models.compile_model): accuracy over label bits flatters a model that predicts no rare label.
MACRO_AUC_PR = "val_auc_pr"


def figure_name(monitor: str) -> str:
    """What a followed metric is called in the summary: accuracy, balanced accuracy or macro AUC-PR."""
    return {BALANCED_ACCURACY: "balanced accuracy", MACRO_AUC_PR: "macro AUC-PR"}.get(monitor, "accuracy")


def positive_weights(counts: Sequence[int], examples: int, cap: float = MAX_WEIGHT) -> List[float]:
    """Multi-label: each label's weight on its positive examples in the binary cross-entropy. A rare label (its
    images outnumbered more than IMBALANCED_RATIO to 1 by the images without it) gets negatives / positives, at
    most `cap`, so that its few positives weigh as much as its negatives; the other labels 1."""
    weights = []
    for positives in counts:
        negatives = examples - positives
        rare = positives > 0 and negatives > IMBALANCED_RATIO * positives
        weights.append(min(cap, negatives / positives) if rare else 1.0)
    return weights


def multi_label_plan(mode: str, counts: Sequence[int], examples: int, label_names: Sequence[str]) -> Dict:
    """What multi-label training does about rare labels (counts: the train images each label applies to, of
    `examples`), as training.json records it: the positive weights in the loss (--class-balance auto or weights;
    sampling cannot draw class-balanced batches of images that hold several labels, so it weighs the loss too),
    the starting bias (the log-odds of each label's weighted share) and the metric it follows."""
    weighted = mode in ("auto", "weights", "sampling")
    weights = positive_weights(counts, examples) if weighted else [1.0] * len(counts)
    chosen = "weights" if weighted and any(w != 1.0 for w in weights) else "off"
    bias = []
    for positives, w in zip(counts, weights):
        share = w * positives / (w * positives + (examples - positives)) if examples else 0.0
        bias.append(math.log(share / (1 - share)) if 0 < share < 1 else (-20.0 if share <= 0 else 20.0))
    by_name = dict(zip(label_names, counts))
    return {
        "asked": mode,
        "mode": chosen,
        "task": "multi",
        "counts": by_name,
        "examples": examples,
        "imbalance_ratio": imbalance_ratio(by_name),
        "imbalanced": chosen == "weights",
        "positive_weights": weights if chosen == "weights" else None,
        "weights": None,
        "shares": None,
        "initial_bias": bias,
        "monitor": MACRO_AUC_PR,
    }


def choose(mode: str, counts: Sequence[int]) -> str:
    """What --class-balance MODE does on a train split of these counts: weights, sampling or off."""
    if mode == "auto":
        return "weights" if is_imbalanced({str(i): n for i, n in enumerate(counts)}) else "off"
    return mode


def plan(mode: str, counts: Sequence[int], class_names: Sequence[str]) -> Dict:
    """What training does about the class mix of its train split (counts per class id), as training.json
    records it: the mode, the loss weights or batch shares, the starting bias, and the metric it follows."""
    chosen = choose(mode, counts)
    weights = loss_weights(counts) if chosen == "weights" else None
    shares = sampling_shares(counts) if chosen == "sampling" else None
    by_name = dict(zip(class_names, counts))
    return {
        "asked": mode,
        "mode": chosen,
        "counts": by_name,
        "imbalance_ratio": imbalance_ratio(by_name),
        "imbalanced": is_imbalanced(by_name),
        "weights": weights,
        "shares": shares,
        "initial_bias": initial_bias(shares if shares else effective_mix(counts, weights)),
        "monitor": BALANCED_ACCURACY if is_imbalanced(by_name) else ACCURACY,
    }
