"""The Evaluator on a multi-label model (trainer/task.py records "task": "multi" in model_info.json): TFMA's
per-label metrics, a threshold per label chosen on eval, a macro metric blessed on, and every label judged.

TFMA computes (the eval config is rewritten once the model is known, as for single-label's class checks):

  per label        (binarize class_ids: the label's column of the multi-hot labels and of the probabilities)
                   AUCPrecisionRecall, Precision and Recall at 0.5, and ConfusionMatrixAtThresholds at
                   evaluation_views.THRESHOLDS (the curves, and the threshold chosen)
  macro AUC-PR     AUCPrecisionRecall macro-averaged over the informative labels (aggregate macro_average, each
                   weighted 1; a label on every eval image scores 1 whatever the model does, one on none has no
                   curve): what blessing asks to reach the --accuracy-threshold bound, and to be no worse than
                   the last blessed model's
  the plot         MultiLabelConfusionMatrixPlot at a few thresholds (which labels are given for which)

Then, from TFMA's matrices (plain Python, `thresholds_and_views`): a threshold per label. With
--confidence-threshold, that one for every label; with --target-precision, the lowest threshold at which the
label's precision reaches it (a label that never does keeps its best-F1 threshold, and says so); else the Trainer's:
each label's best F1 on its held-out train images (trainer/operating_point.label_thresholds; a model trained before
them: each label's best F1 on eval). views.json records the curves, the thresholds and every label's precision, recall and F1 at its
own. And every label is judged as single-label's classes are: recall at its threshold at least --min-class-recall
for a label on at least class_balance.MIN_EVAL_EXAMPLES eval images, some image found for one on at least
MIN_EVAL_TO_FIND, and no label judged may be at chance level (its AUC-PR within MIN_AUC_PR_LIFT of its base rate,
or its threshold giving it to every eval image: a label in no pixel); a model that fails it is not blessed (the
blessing TFMA gave is taken back, and class_gate.json says which label failed and why).
"""

import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from components.evaluator.eval_config import ACCURACY_METRIC, class_gate
from components.evaluator.views import THRESHOLDS, thresholds_with

AUC_PR = "AUCPrecisionRecall"
MATRICES = "confusion_matrix_at_thresholds"  # ConfusionMatrixAtThresholds's metric name
PLOT_THRESHOLDS = [0.25, 0.5, 0.75]


# A label the model tells from chance lifts its AUC-PR above its base rate p (a model that knows nothing scores p):
# (AUC-PR - p) / (1 - p) under this fails the label's gate. Measured on 600 images of coloured squares (the small CNN,
# 120 eval images): the five colours 0.94-1.00, a label given at random to half the images -0.02.
MIN_AUC_PR_LIFT = 0.1


def informative(support: int, images: Optional[int]) -> bool:
    """Whether a label's eval images can tell anything about the model: some, and not every one (a label on every
    image scores a perfect AUC-PR whatever the model does; one on none has no curve)."""
    return support > 0 and (images is None or support < images)


def eval_config_for(
    config,
    num_labels: int,
    compare: bool,
    confidence_threshold: Optional[float] = None,
    eval_support: Optional[Sequence[int]] = None,
    eval_images: Optional[int] = None,
):
    """`config` (eval_config.eval_config's, thresholds set) for a multi-label model of num_labels labels: the labels
    as the multi-hot LABELS_KEY, and the metrics above. Its accuracy lower bound becomes macro AUC-PR's, averaged over
    the informative labels (eval_support: images per label id, of eval_images; a label on no eval image has no
    precision-recall curve, and TFMA would count it 0; one on every eval image scores 1 whatever the model does)."""
    # TFMA: the run summary imports this module (through results.py); only the Evaluator's config needs it
    from tensorflow_model_analysis.proto import config_pb2 as tfma_config

    # imports TensorFlow: the same reason
    from trainer.features import LABELS_KEY

    bound = _accuracy_bound(config)
    for spec in config.model_specs:
        spec.label_key = LABELS_KEY
    threshold = tfma_config.MetricThreshold(
        value_threshold=tfma_config.GenericValueThreshold(lower_bound={"value": bound})
    )
    if compare:
        threshold.change_threshold.CopyFrom(
            tfma_config.GenericChangeThreshold(
                direction=tfma_config.MetricDirection.HIGHER_IS_BETTER, absolute={"value": -1e-10}
            )
        )
    del config.metrics_specs[:]
    config.metrics_specs.extend(_metrics_specs(num_labels, threshold, confidence_threshold, eval_support, eval_images))
    return config, bound


def _accuracy_bound(config) -> float:
    """The accuracy metric's lower bound in `config` (0 without one)."""
    return next(
        (
            m.threshold.value_threshold.lower_bound.value
            for spec in config.metrics_specs
            for m in spec.metrics
            if m.class_name == ACCURACY_METRIC
        ),
        0.0,
    )


def _metrics_specs(
    num_labels: int,
    threshold,
    confidence_threshold: Optional[float],
    eval_support: Optional[Sequence[int]],
    eval_images: Optional[int],
) -> list:
    """The multi-label metrics: counts and the confusion plot, each label's figures, and macro AUC-PR held to
    `threshold`."""
    # TFMA: as in eval_config_for
    from tensorflow_model_analysis.proto import config_pb2 as tfma_config

    labels = tfma_config.BinarizationOptions(class_ids=tfma_config.RepeatedInt32Value(values=list(range(num_labels))))
    return [
        tfma_config.MetricsSpec(
            metrics=[
                tfma_config.MetricConfig(class_name="ExampleCount"),
                tfma_config.MetricConfig(
                    class_name="MultiLabelConfusionMatrixPlot", config=json.dumps({"thresholds": PLOT_THRESHOLDS})
                ),
            ]
        ),
        tfma_config.MetricsSpec(
            metrics=[
                tfma_config.MetricConfig(class_name=AUC_PR),
                tfma_config.MetricConfig(class_name="Precision"),
                tfma_config.MetricConfig(class_name="Recall"),
                tfma_config.MetricConfig(
                    class_name="ConfusionMatrixAtThresholds",
                    config=json.dumps({"thresholds": thresholds_with(confidence_threshold)}),
                ),
            ],
            binarize=labels,
        ),
        tfma_config.MetricsSpec(
            metrics=[tfma_config.MetricConfig(class_name=AUC_PR, threshold=threshold)],
            aggregate=tfma_config.AggregationOptions(
                macro_average=True,
                class_weights={
                    i: 1.0 for i in range(num_labels) if not eval_support or informative(eval_support[i], eval_images)
                }
                or {i: 1.0 for i in range(num_labels)},
            ),
        ),
    ]


def read_metrics(evaluation_uri: str) -> Dict[str, Any]:
    """The candidate's (and baseline's) figures, overall slice: {"macro_auc_pr", "baseline_macro_auc_pr",
    "example_count", "per_label": {id: {"auc_pr", "precision", "recall", "matrices": [(t, tp, fp, tn, fn)]}}}."""
    # TFMA: the run summary imports this module (through results.py); only reading metrics needs it
    import tensorflow_model_analysis as tfma

    found: Dict[str, Any] = {
        "macro_auc_pr": None,
        "baseline_macro_auc_pr": None,
        "example_count": None,
        "per_label": {},
    }
    for metrics in tfma.load_metrics(evaluation_uri):
        if metrics.slice_key.single_slice_keys:
            continue
        for kv in metrics.metric_keys_and_values:
            key = kv.key
            if key.is_diff:
                continue
            baseline = key.model_name == "baseline"
            macro = key.HasField("aggregation_type") and key.aggregation_type.macro_average
            if key.name == "auc_precision_recall" and macro:
                found["baseline_macro_auc_pr" if baseline else "macro_auc_pr"] = _number(kv.value)
            elif key.name == "example_count" and not baseline and not key.HasField("sub_key"):
                found["example_count"] = int(_number(kv.value) or 0)
            elif not baseline and key.HasField("sub_key") and key.sub_key.HasField("class_id"):
                label = found["per_label"].setdefault(key.sub_key.class_id.value, {})
                if key.name == MATRICES:
                    label["matrices"] = [
                        (
                            round(m.threshold, 6),
                            m.true_positives,
                            m.false_positives,
                            m.true_negatives,
                            m.false_negatives,
                        )
                        for m in kv.value.confusion_matrix_at_thresholds.matrices
                    ]
                elif key.name in ("auc_precision_recall", "precision", "recall"):
                    label["auc_pr" if key.name == "auc_precision_recall" else key.name] = _number(kv.value)
    return found


def _number(value) -> Optional[float]:
    if not value.HasField("double_value"):
        return None
    number = value.double_value.value
    return None if math.isnan(number) else number


def _rates(tp: float, fp: float, fn: float) -> Dict[str, Optional[float]]:
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision and recall
        else 0.0
        if precision is not None and recall is not None
        else None
    )
    return {"precision": precision, "recall": recall, "f1": f1, "support": int(tp + fn), "predicted": int(tp + fp)}


def _best_f1(curve: List[Dict[str, Any]], images: Optional[int] = None) -> Dict[str, Any]:
    """The point of highest F1 (ties: the lower threshold) among those that do not give every image the label
    (threshold 0, and on a label most images have, the low thresholds where every image is over it: their F1 is
    high and they tell nothing); threshold 0.5 when no point has an F1."""
    scored = [p for p in curve if p["f1"] is not None and p["threshold"] > 0]
    telling = [p for p in scored if not images or (p.get("predicted") or 0) < images]
    if not scored:
        return {"threshold": 0.5}
    return max(telling or scored, key=lambda p: (p["f1"], -p["threshold"]))


def choose(
    curve: List[Dict[str, Any]],
    confidence_threshold: Optional[float],
    target_precision: Optional[float],
    images: Optional[int] = None,
) -> Dict[str, Any]:
    """One label's threshold, and how it was chosen (its curve: precision, recall and F1 at each threshold; images:
    the eval images)."""
    if confidence_threshold is not None:
        return {"threshold": confidence_threshold, "how": f"--confidence-threshold {confidence_threshold:g}"}
    best = _best_f1(curve, images)
    if target_precision is not None:
        reaching = [
            p
            for p in curve
            if p["precision"] is not None and p["recall"] and p["precision"] >= target_precision - 1e-12
        ]
        if reaching:
            return {
                "threshold": reaching[0]["threshold"],
                "how": f"the lowest reaching precision {target_precision:g} (--target-precision)",
            }
        return {
            "threshold": best["threshold"],
            "target_missed": True,
            "how": f"best F1 on eval: no threshold reaches precision {target_precision:g} (--target-precision)",
        }
    return {"threshold": best["threshold"], "how": "best F1 on eval"}


def views(
    found: Dict[str, Any],
    names: Sequence[str],
    confidence_threshold: Optional[float] = None,
    target_precision: Optional[float] = None,
    given: Optional[Dict[str, float]] = None,
    how: Optional[str] = None,
) -> Dict[str, Any]:
    """views.json of a multi-label evaluation: each label's curve and threshold (chosen here, or `given`: the eval
    split's, for the test split), every label's figures at its threshold, and their macro averages."""
    labels, per_class = {}, {}
    for label_id, name in enumerate(names):
        figures = found["per_label"].get(label_id, {})
        curve = [{"threshold": t, **_rates(tp, fp, fn)} for t, tp, fp, _tn, fn in figures.get("matrices", [])]
        chosen = (
            {"threshold": given[name], "how": how or "given"}
            if given and name in given
            else choose(curve, confidence_threshold, target_precision, found.get("example_count"))
        )
        point = min(curve, key=lambda p: abs(p["threshold"] - chosen["threshold"])) if curve else {}
        at = {k: point.get(k) for k in ("precision", "recall", "f1", "support", "predicted")}
        labels[name] = {"auc_pr": figures.get("auc_pr"), "chosen": chosen, "curve": curve}
        per_class[name] = {**at, "threshold": chosen["threshold"], "auc_pr": figures.get("auc_pr")}
    images = found.get("example_count")
    with_images = [m for m in per_class.values() if informative(m.get("support") or 0, images)]

    def macro(key: str) -> Optional[float]:
        values = [m[key] for m in with_images if m.get(key) is not None]
        return sum(values) / len(values) if values else None

    thresholds = {name: labels[name]["chosen"]["threshold"] for name in names}
    hows = sorted({labels[name]["chosen"]["how"] for name in names})
    missed = [name for name in names if labels[name]["chosen"].get("target_missed")]
    return {
        "task": "multi",
        "thresholds": thresholds_with(confidence_threshold) if not given else THRESHOLDS,
        "labels": labels,
        "chosen": {
            "thresholds": thresholds,
            "how": "; ".join(hows) if len(hows) > 1 else (hows[0] if hows else ""),
            **({"target_missed": missed} if missed else {}),
        },
        "at_threshold": {
            "examples": found.get("example_count"),
            "per_class": per_class,
            "macro_precision": macro("precision"),
            "macro_recall": macro("recall"),
            "macro_f1": macro("f1"),
            "macro_auc_pr": found.get("macro_auc_pr"),
            # on every eval image: no figure of theirs says anything of the model (left out above)
            "uninformative": [name for name, m in per_class.items() if images and (m.get("support") or 0) >= images],
        },
    }


def label_gate(
    names: Sequence[str],
    eval_counts: Dict[str, int],
    train_counts: Dict[str, int],
    floor: float,
    bound: float,
    compared: bool,
    eval_images: Optional[int] = None,
) -> Dict[str, Any]:
    """class_gate.json's record of what is judged: as single-label's (eval_config.class_gate), for labels, with the
    macro AUC-PR bound (over the informative labels), what the last blessed model is compared on, and the least
    lift of a judged label's AUC-PR over its base rate."""
    return {
        "task": "multi",
        **class_gate(names, eval_counts, train_counts, floor),
        "min_macro_auc_pr": bound,
        "compared_on": "macro_auc_pr" if compared else None,
        "eval_images": eval_images,
        "min_auc_pr_lift": MIN_AUC_PR_LIFT,
    }


def label_failures(gate: Dict[str, Any], found_views: Dict[str, Any]) -> List[str]:
    """One line per judged label that fails at its threshold: recall under --min-class-recall, none of a small
    label's eval images found, or (a label on enough eval images to tell) no better than chance: its AUC-PR hardly
    above its base rate, or its threshold giving it to every eval image."""
    failures = []
    per_class = found_views["at_threshold"]["per_class"]
    images = found_views["at_threshold"].get("examples") or gate.get("eval_images")
    for label_id in gate["judged"] + gate["must_find"]:
        name = gate["class_names"][label_id]
        figures = per_class.get(name, {})
        recall, threshold = figures.get("recall") or 0.0, figures.get("threshold")
        support = gate["eval_examples"][label_id]
        chance = _chance_level(figures, support, images) if label_id in gate["judged"] else None
        if chance:
            failures.append(
                f"label {name!r} {chance} ({support:,} of {images:,} eval images): the model cannot tell it "
                "from chance; check its labels, or leave it out"
            )
            continue
        images_of_label = support
        if label_id in gate["judged"] and recall < gate["min_class_recall"]:
            failures.append(
                f"label {name!r} recall {recall:.2f} < {gate['min_class_recall']:.2f} at its threshold "
                f"{threshold:g} ({images_of_label:,} eval images) (--min-class-recall)"
            )
        elif label_id in gate["must_find"] and recall <= 0:
            failures.append(
                f"label {name!r} recall 0.00 at its threshold {threshold:g}: none of its "
                f"{images_of_label:,} eval images found (--min-class-recall)"
            )
    return failures


def _chance_level(figures: Dict[str, Any], support: int, images: Optional[int]) -> str:
    """What says a label is at chance level ("" when nothing does): its AUC-PR within MIN_AUC_PR_LIFT of its base
    rate, or, with no AUC-PR to read, its threshold predicting it for every eval image while some lack it (a label
    whose curve tells images apart gets a threshold that does not: _best_f1). A label on every eval image is not
    judged so (nothing to tell apart: it is left out of the macro figure instead)."""
    if not images or not informative(support, images):
        return ""
    base, auc_pr = support / images, figures.get("auc_pr")
    if auc_pr is not None and (auc_pr - base) / (1 - base) < MIN_AUC_PR_LIFT:
        return f"AUC-PR {auc_pr:.2f} at its base rate {base:.2f}"
    if auc_pr is None and (figures.get("predicted") or 0) >= images:
        return f"given to every eval image at its threshold {figures.get('threshold'):g}"
    return ""


def take_back_blessing(blessing, failures: List[str]) -> None:
    """The model is not blessed after all: TFX's marker files and property say so (the Pusher reads them)."""
    # TFX: the run summary imports this module (through results.py); only the Evaluator takes blessings back
    from tfx.dsl.io import fileio
    from tfx.utils import io_utils

    blessed = os.path.join(blessing.uri, "BLESSED")
    if fileio.exists(blessed):
        fileio.remove(blessed)
    io_utils.write_string_file(os.path.join(blessing.uri, "NOT_BLESSED"), "")
    blessing.set_int_custom_property("blessed", 0)
    blessing.set_string_custom_property("label_gate_failures", "; ".join(failures))
