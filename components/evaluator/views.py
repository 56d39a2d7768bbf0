"""Evaluation as Vertex AutoML shows it, from TFMA's confusion matrices at confidence thresholds.

The Evaluator asks TFMA for MultiClassConfusionMatrixPlot at THRESHOLDS: at a threshold t, an example
whose top probability is at or below t has no prediction (TFMA's predicted class -1). From those counts:

  coverage(t)             share of examples with a prediction
  precision(t), recall(t) overall: correct predictions / predictions, correct predictions / examples
  per class               precision, recall and F1 of each class at t
  curves                  precision against recall as t moves, overall and per class

and the confidence threshold that goes with the model (imagepipe predict answers "unsure" at or below it):
--confidence-threshold, or the lowest t whose precision reaches --target-precision, or none (0).
Plain Python over the counts (results.py reads them from TFMA's plots): the Evaluator writes
views.json with the evaluation; the report, the model card and predict read it.
"""

from typing import Dict, List, Optional, Sequence, Tuple

from trainer.operating_point import THRESHOLD_GRID

THRESHOLDS = THRESHOLD_GRID  # 0, 0.025, ..., 0.975, 0.99: the Trainer's label thresholds are chosen on them too
VIEWS_FILE = "views.json"  # in the evaluation artifact (and test/ for a test split)

Matrix = List[Tuple[int, int, float]]  # (actual class id, predicted class id or -1, count)


def given_a_class(probability: float, threshold: float) -> bool:
    """TFMA's rule at a threshold (an example gets no class when its top probability is <= it), and so
    imagepipe predict's: at or below a threshold above 0, the model is unsure."""
    return threshold <= 0 or probability > threshold


def thresholds_with(chosen: Optional[float]) -> List[float]:
    """THRESHOLDS, and an explicit --confidence-threshold between them."""
    return sorted(set(THRESHOLDS) | ({round(chosen, 6)} if chosen is not None else set()))


def _rates(matrix: Matrix, classes: int) -> Dict:
    """Coverage, precision, recall overall and per class at one threshold: one pass over the matrix's entries
    (hundreds of classes x 41 thresholds stay milliseconds)."""
    total = predicted = correct = 0.0
    tp, made, actual = [0.0] * classes, [0.0] * classes, [0.0] * classes
    for a, p, n in matrix:
        total += n
        if 0 <= a < classes:
            actual[a] += n
        if p >= 0:
            predicted += n
            if p < classes:
                made[p] += n
            if a == p:
                correct += n
                if p < classes:
                    tp[p] += n
    per_class = {}
    for c in range(classes):
        precision = tp[c] / made[c] if made[c] else None
        recall = tp[c] / actual[c] if actual[c] else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall > 0
            else 0.0
            if precision is not None and recall is not None
            else None
        )
        per_class[c] = {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "support": int(actual[c]),
            "predicted": int(made[c]),
        }
    return {
        "coverage": predicted / total if total else None,
        "precision": correct / predicted if predicted else None,
        "recall": correct / total if total else None,
        "examples": int(total),
        "per_class": per_class,
    }


def unreachable(curve: List[Dict], point: Dict) -> List[str]:
    """The classes the model finds at threshold 0 (some recall) but at this point's threshold no longer finds at
    all: above it, no image of theirs is ever given their class."""
    if not curve:
        return []
    found = [name for name, m in curve[0]["per_class"].items() if m["recall"]]
    return [name for name in found if not point["per_class"].get(name, {}).get("recall")]


def choose(curve: List[Dict], confidence_threshold: Optional[float], target_precision: Optional[float]) -> Dict:
    """The threshold that goes with the model, and how it was chosen. A threshold chosen for a target precision
    never makes a class unreachable: the highest below it that keeps every class is taken instead."""
    if confidence_threshold is not None:
        point = min(curve, key=lambda p: abs(p["threshold"] - confidence_threshold)) if curve else None
        lost = unreachable(curve, point) if point else []
        return {
            "threshold": confidence_threshold,
            "how": f"--confidence-threshold {confidence_threshold:g}"
            + (
                "; above it the model gives no eval image the class " + ", ".join(repr(n) for n in lost) if lost else ""
            ),
            **({"unreachable": lost} if lost else {}),
        }
    if target_precision is not None:
        reaching = [p for p in curve if p["precision"] is not None and p["precision"] >= target_precision - 1e-12]
        if reaching and not unreachable(curve, reaching[0]):
            return {
                "threshold": reaching[0]["threshold"],
                "how": f"the lowest reaching precision {target_precision:g} (--target-precision)",
            }
        if reaching:
            lost = unreachable(curve, reaching[0])
            keeping = [p for p in curve if p["threshold"] < reaching[0]["threshold"] and not unreachable(curve, p)]
            best = keeping[-1]["threshold"] if keeping else 0.0
            return {
                "threshold": best,
                "target_missed": True,
                "how": f"{best:g}: precision {target_precision:g} (--target-precision) is reached only at "
                f"{reaching[0]['threshold']:g}, where the model no longer gives any image the class "
                + ", ".join(repr(n) for n in lost)
                + "; the highest threshold that keeps every class",
            }
        return {
            "threshold": 0.0,
            "how": f"none: no threshold reaches precision {target_precision:g} (--target-precision)",
            "target_missed": True,
        }
    return {
        "threshold": 0.0,
        "how": "none (every image gets a class; --confidence-threshold or --target-precision sets one)",
    }


def views(
    matrices: Dict[float, Matrix],
    class_names: Sequence[str],
    confidence_threshold: Optional[float] = None,
    target_precision: Optional[float] = None,
) -> Dict:
    """views.json: the curves over the thresholds, the chosen threshold, and every metric at it."""
    classes = len(class_names)
    curve, rates_at = [], {}
    for t in sorted(matrices):
        rates = rates_at[t] = _rates(matrices[t], classes)
        curve.append(
            {
                "threshold": t,
                **{k: rates[k] for k in ("coverage", "precision", "recall")},
                "per_class": {
                    class_names[c]: {k: m[k] for k in ("precision", "recall")} for c, m in rates["per_class"].items()
                },
            }
        )
    chosen = choose(curve, confidence_threshold, target_precision)
    at = rates_at[_nearest(matrices, chosen["threshold"])] if matrices else None
    return {
        "thresholds": sorted(matrices),
        "curve": curve,
        "chosen": chosen,
        "at_threshold": None
        if at is None
        else {
            "threshold": chosen["threshold"],
            **{k: at[k] for k in ("coverage", "precision", "recall", "examples")},
            "per_class": {class_names[c]: m for c, m in at["per_class"].items()},
        },
    }


def _nearest(matrices: Dict[float, Matrix], threshold: float) -> float:
    return min(matrices, key=lambda t: abs(t - threshold))
