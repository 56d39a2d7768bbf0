"""What the Evaluator found, read back from its artifact (TFMA's metrics, plots and validation result) as
plain dicts: the run summary, the report and the model card read the same figures.
"""

import json
import math
import os
from typing import Any, Dict, List, Optional

from components.evaluator import multi_label as multi_label_evaluation
from components.evaluator.eval_config import CLASS_GATE_FILE, EVALUATED_ON_FILE, TEST_SPLIT
from components.evaluator.views import VIEWS_FILE


def metrics(evaluation_uri: str) -> Dict[str, Any]:
    """Overall accuracy, balanced accuracy and example count of the candidate (and baseline), each class's
    recall and precision (components/evaluator/metrics.py), what the gate judged (class_gate.json), and the
    validation verdict: one line per failed check, naming the class."""
    # TFMA: the run summary and the report import this module; only reading an evaluation needs it
    import tensorflow_model_analysis as tfma

    found: Dict[str, Any] = {
        "accuracy": None,
        "baseline_accuracy": None,
        "balanced_accuracy": None,
        "baseline_balanced_accuracy": None,
        "example_count": None,
        "per_class": {},
        "gate": class_gate(evaluation_uri),
        "failures": [],
    }
    if (found["gate"] or views(evaluation_uri) or {}).get("task") == "multi":  # (a test split has no gate of its own)
        return _multi_label_metrics(evaluation_uri, found)
    names = (found["gate"] or {}).get("class_names") or []
    _read_overall_slice(evaluation_uri, names, found)
    support = (found["gate"] or {}).get("eval_examples") or []
    found["per_class"] = {
        name: {
            "precision": found["per_class"].get(name, {}).get("precision"),
            "recall": found["per_class"].get(name, {}).get("recall"),
            "support": support[i] if i < len(support) else None,
        }
        for i, name in enumerate(names)
        if name in found["per_class"]
    }
    validation = tfma.load_validation_result(evaluation_uri)
    for per_slice in validation.metric_validations_per_slice:
        for failure in per_slice.failures:
            found["failures"].append(_failure_text(failure, found))
    return found


def _read_overall_slice(evaluation_uri: str, names: List[str], found: Dict[str, Any]) -> None:
    """The overall slice's accuracies and example count into `found`, and each class's recall and precision
    (NaN: None) into found["per_class"] by name."""

    # TFMA: as in metrics()
    import tensorflow_model_analysis as tfma

    # imports TFMA: as in metrics()
    from components.evaluator.metrics import BALANCED_ACCURACY, CLASS_PRECISION, CLASS_RECALL

    for metrics in tfma.load_metrics(evaluation_uri):
        if metrics.slice_key.single_slice_keys:
            continue  # overall slice only
        for kv in metrics.metric_keys_and_values:
            key = kv.key
            if key.is_diff or not kv.value.HasField("double_value"):
                continue
            value = kv.value.double_value.value
            baseline = key.model_name == "baseline"
            if key.HasField("sub_key"):
                if key.name in (CLASS_RECALL, CLASS_PRECISION) and not baseline and key.sub_key.HasField("class_id"):
                    class_id = key.sub_key.class_id.value
                    name = names[class_id] if class_id < len(names) else str(class_id)
                    found["per_class"].setdefault(name, {})[key.name.split("_")[1]] = (
                        None if math.isnan(value) else value
                    )
                continue
            if key.name == "sparse_categorical_accuracy":
                found["baseline_accuracy" if baseline else "accuracy"] = value
            elif key.name == BALANCED_ACCURACY:
                found["baseline_balanced_accuracy" if baseline else "balanced_accuracy"] = (
                    None if math.isnan(value) else value
                )
            elif key.name == "example_count" and not baseline:
                found["example_count"] = int(value)


def _multi_label_metrics(evaluation_uri: str, found: Dict[str, Any]) -> Dict[str, Any]:
    """metrics() of a multi-label evaluation (components/evaluator/multi_label.py): macro AUC-PR (and the last
    blessed model's), each label's precision, recall, F1 and AUC-PR at its own threshold, the failures (TFMA's and
    the label gate's)."""
    # TFMA: as in metrics()
    import tensorflow_model_analysis as tfma

    read = multi_label_evaluation.read_metrics(evaluation_uri)
    at = (views(evaluation_uri) or {}).get("at_threshold") or {}
    found.update(
        task="multi",
        example_count=read["example_count"],
        macro_auc_pr=read["macro_auc_pr"],
        baseline_macro_auc_pr=read["baseline_macro_auc_pr"],
        macro_f1=at.get("macro_f1"),
        macro_precision=at.get("macro_precision"),
        macro_recall=at.get("macro_recall"),
        per_class={
            name: {k: m.get(k) for k in ("precision", "recall", "f1", "support", "threshold", "auc_pr")}
            for name, m in (at.get("per_class") or {}).items()
        },
    )
    for per_slice in tfma.load_validation_result(evaluation_uri).metric_validations_per_slice:
        for failure in per_slice.failures:
            value = failure.metric_value.double_value.value if failure.metric_value.HasField("double_value") else None
            threshold = failure.metric_threshold
            if failure.metric_key.is_diff and found["baseline_macro_auc_pr"] is not None:
                found["failures"].append(
                    f"macro AUC-PR {found['macro_auc_pr']:.4f} is below the last blessed "
                    f"model's {found['baseline_macro_auc_pr']:.4f}"
                )
            elif threshold.value_threshold.HasField("lower_bound") and value is not None:
                found["failures"].append(
                    f"macro AUC-PR {value:.4f} is below the threshold "
                    f"{threshold.value_threshold.lower_bound.value:.4f} (--accuracy-threshold)"
                )
    found["failures"] += (found["gate"] or {}).get("failures") or []
    return found


def weakest_label(found: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A multi-label evaluation's label of lowest F1 at its threshold, among those with eval images."""
    rows = [
        {"name": name, "f1": m["f1"], "recall": m["recall"], "support": m["support"], "threshold": m["threshold"]}
        for name, m in (found.get("per_class") or {}).items()
        if m.get("support") and m.get("f1") is not None
    ]
    return min(rows, key=lambda r: (r["f1"], -r["support"])) if rows else None


def json_file(folder: str, name: str) -> Optional[Dict[str, Any]]:
    """A JSON file of an artifact's folder (local or gs://), or None where it has none."""
    # TFX loads TensorFlow (~6 s): the run summary and the report import this module
    from tfx.dsl.io import fileio

    path = os.path.join(folder, name)
    if not fileio.exists(path):
        return None
    with fileio.open(path, "r") as f:
        return json.loads(f.read())


INDEX_FILE = "index.json"  # what a folder of the evaluation's images holds (explanations/, misclassified/)


def folder_index(evaluation_uri: str, folder_name: str) -> Dict[str, Any]:
    """index.json of a folder of the evaluation's images (explanations/, misclassified/), with "folder": where the
    images are; {} when it has none. Local files only: what the run summary, the report and the review page read."""
    folder = os.path.join(evaluation_uri, folder_name)
    path = os.path.join(folder, INDEX_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {**json.load(f), "folder": folder}


def class_gate(evaluation_uri: str) -> Optional[Dict[str, Any]]:
    """class_gate.json (components/evaluator/executor.py): the classes judged, their counts, what was compared."""
    return json_file(evaluation_uri, CLASS_GATE_FILE)


def evaluated_on(evaluation_uri: str) -> Optional[Dict[str, Any]]:
    """evaluated_on.json (components/evaluator/on_features.py): the heads on the features step's features, or the
    serving models (and why), with the serving model's agreement; None for an evaluation made before it existed."""
    return json_file(evaluation_uri, EVALUATED_ON_FILE)


def weakest_class(found: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The class with the lowest recall among those with eval images (judged ones first): {name, recall,
    support, judged}, or None when the evaluation has no per-class figures."""
    gate = found.get("gate") or {}
    names, support = gate.get("class_names") or [], gate.get("eval_examples") or []
    judged = set(gate.get("judged") or [])
    rows = [
        {"name": name, "recall": found["per_class"][name]["recall"], "support": support[i], "judged": i in judged}
        for i, name in enumerate(names)
        if i < len(support) and support[i] and (found.get("per_class", {}).get(name) or {}).get("recall") is not None
    ]
    return min(rows, key=lambda r: (r["recall"], not r["judged"], -r["support"])) if rows else None


def _failure_text(failure, found: Dict[str, Any]) -> str:
    """What failed, with the value and the bound (TFMA's own message is often empty), naming the class."""
    name, threshold = failure.metric_key.name, failure.metric_threshold
    value = failure.metric_value.double_value.value if failure.metric_value.HasField("double_value") else None
    has_bound = threshold.HasField("value_threshold") and threshold.value_threshold.HasField("lower_bound")
    if name == "class_recall" and failure.metric_key.sub_key.HasField("class_id") and value is not None:
        gate = found.get("gate") or {}
        class_id = failure.metric_key.sub_key.class_id.value
        names, support = gate.get("class_names") or [], gate.get("eval_examples") or []
        label = repr(names[class_id]) if class_id < len(names) else f"id {class_id}"
        images = f" ({support[class_id]:,} eval images)" if class_id < len(support) else ""
        bound = threshold.value_threshold.lower_bound.value
        if bound < 0.005:  # a class with a few eval images: one of them must be found
            count = f"{support[class_id]:,} " if class_id < len(support) else ""
            return f"class {label} recall 0.00: none of its {count}eval images found (--min-class-recall)"
        return f"class {label} recall {value:.2f} < {bound:.2f}{images} (--min-class-recall)"
    if failure.metric_key.is_diff:
        for metric, shown in (("balanced_accuracy", "balanced accuracy"), ("accuracy", "accuracy")):
            if name.endswith(metric) and found.get(metric) is not None and found.get(f"baseline_{metric}") is not None:
                return (
                    f"{shown} {found[metric]:.4f} is below the last blessed model's {found[f'baseline_{metric}']:.4f}"
                )
    if has_bound and value is not None:
        shown = "accuracy" if name == "sparse_categorical_accuracy" else name
        option = " (--accuracy-threshold)" if name == "sparse_categorical_accuracy" else ""
        return f"{shown} {value:.4f} is below the threshold {threshold.value_threshold.lower_bound.value:.4f}{option}"
    return f"{name}: {failure.message or 'failed its threshold'}"


def matrices(evaluation_uri: str) -> Dict[float, List[tuple]]:
    """TFMA's MultiClassConfusionMatrixPlot of the candidate, overall slice: {threshold: [(actual class id,
    predicted class id or -1 below the threshold, count)]}."""
    # TFMA: as in metrics()
    import tensorflow_model_analysis as tfma

    for plots in tfma.load_plots(evaluation_uri):
        if plots.slice_key.single_slice_keys:
            continue
        for kv in plots.plot_keys_and_values:
            if kv.key.model_name == "baseline" or not kv.value.HasField("multi_class_confusion_matrix_at_thresholds"):
                continue
            return {
                round(m.threshold, 6): [
                    (e.actual_class_id, e.predicted_class_id, e.num_weighted_examples) for e in m.entries
                ]
                for m in kv.value.multi_class_confusion_matrix_at_thresholds.matrices
            }
    return {}


def confusion_matrix(evaluation_uri: str) -> List[List[int]]:
    """The candidate's [actual class id, predicted class id, count] entries (argmax predictions: threshold 0)."""
    found = matrices(evaluation_uri)
    if not found:
        return []
    return [[a, p, int(n)] for a, p, n in found[min(found, key=abs)]]


def views(evaluation_uri: str) -> Optional[Dict[str, Any]]:
    """views.json (components/evaluator/views.py), or None (an evaluation made before it existed)."""
    return json_file(evaluation_uri, VIEWS_FILE)


def test_split(evaluation_uri: str) -> Optional[Dict[str, Any]]:
    """The test split's scores (the Evaluator's <evaluation>/test), or None when the data had no test split."""
    # TFX: as in class_gate()
    from tfx.dsl.io import fileio

    folder = os.path.join(evaluation_uri, TEST_SPLIT)
    if not fileio.exists(folder):
        return None
    return {**metrics(folder), "confusion": confusion_matrix(folder), "views": views(folder)}


def accuracy_threshold(evaluation_uri: str) -> Optional[float]:
    """The accuracy the Evaluator blessed at, from the eval config it saved."""

    # TFX: as in class_gate()
    from tfx.dsl.io import fileio

    path = os.path.join(evaluation_uri, "eval_config.json")
    if not fileio.exists(path):
        return None
    with fileio.open(path, "r") as f:
        saved = json.loads(f.read())
    config = saved.get("evalConfig", saved)
    for spec in config.get("metricsSpecs", []):
        for metric in spec.get("metrics", []):
            bound = metric.get("threshold", {}).get("valueThreshold", {}).get("lowerBound")
            if metric.get("className") == "SparseCategoricalAccuracy" and bound is not None:
                return float(bound)
    return None
