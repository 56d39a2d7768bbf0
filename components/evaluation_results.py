"""What the Evaluator found, read back from its artifact (TFMA's metrics, plots and validation result) as
plain dicts: the run summary, the report and the model card read the same figures.
"""

import os
from typing import Any, Dict, List, Optional


def metrics(evaluation_uri: str) -> Dict[str, Any]:
    """Overall accuracy and example count of the candidate (and baseline), and the validation verdict."""
    import tensorflow_model_analysis as tfma

    found: Dict[str, Any] = {"accuracy": None, "baseline_accuracy": None, "example_count": None,
                             "failures": []}
    for metrics in tfma.load_metrics(evaluation_uri):
        if metrics.slice_key.single_slice_keys:
            continue  # overall slice only
        for kv in metrics.metric_keys_and_values:
            key = kv.key
            if key.HasField("sub_key") or key.is_diff or not kv.value.HasField("double_value"):
                continue
            value = kv.value.double_value.value
            if key.name == "sparse_categorical_accuracy":
                found["baseline_accuracy" if key.model_name == "baseline" else "accuracy"] = value
            elif key.name == "example_count" and key.model_name != "baseline":
                found["example_count"] = int(value)
    validation = tfma.load_validation_result(evaluation_uri)
    for per_slice in validation.metric_validations_per_slice:
        for failure in per_slice.failures:
            found["failures"].append(_failure_text(failure, found))
    return found


def _failure_text(failure, found: Dict[str, Any]) -> str:
    """What failed, with the value and the bound (TFMA's own message is often empty)."""
    name, threshold = failure.metric_key.name, failure.metric_threshold
    value = failure.metric_value.double_value.value if failure.metric_value.HasField("double_value") else None
    has_bound = threshold.HasField("value_threshold") and threshold.value_threshold.HasField("lower_bound")
    if failure.metric_key.is_diff and found.get("baseline_accuracy") is not None and found.get("accuracy") is not None:
        return f"{name} {found['accuracy']:.4f} is below the last blessed model's {found['baseline_accuracy']:.4f}"
    if has_bound and value is not None:
        return f"{name} {value:.4f} is below the threshold {threshold.value_threshold.lower_bound.value:.4f}"
    return f"{name}: {failure.message or 'failed its threshold'}"


def matrices(evaluation_uri: str) -> Dict[float, List[tuple]]:
    """TFMA's MultiClassConfusionMatrixPlot of the candidate, overall slice: {threshold: [(actual class id,
    predicted class id or -1 below the threshold, count)]}."""
    import tensorflow_model_analysis as tfma

    for plots in tfma.load_plots(evaluation_uri):
        if plots.slice_key.single_slice_keys:
            continue
        for kv in plots.plot_keys_and_values:
            if kv.key.model_name == "baseline" or not kv.value.HasField("multi_class_confusion_matrix_at_thresholds"):
                continue
            return {round(m.threshold, 6): [(e.actual_class_id, e.predicted_class_id, e.num_weighted_examples)
                                            for e in m.entries]
                    for m in kv.value.multi_class_confusion_matrix_at_thresholds.matrices}
    return {}


def confusion_matrix(evaluation_uri: str) -> List[List[int]]:
    """The candidate's [actual class id, predicted class id, count] entries (argmax predictions: threshold 0)."""
    found = matrices(evaluation_uri)
    if not found:
        return []
    return [[a, p, int(n)] for a, p, n in found[min(found, key=abs)]]


def views(evaluation_uri: str) -> Optional[Dict[str, Any]]:
    """views.json (components/evaluation_views.py), or None (an evaluation made before it existed)."""
    import json

    from tfx.dsl.io import fileio

    from components.evaluation_views import VIEWS_FILE

    path = os.path.join(evaluation_uri, VIEWS_FILE)
    if not fileio.exists(path):
        return None
    with fileio.open(path, "r") as f:
        return json.loads(f.read())


def test_split(evaluation_uri: str) -> Optional[Dict[str, Any]]:
    """The test split's scores (the Evaluator's <evaluation>/test), or None when the data had no test split."""
    from tfx.dsl.io import fileio

    folder = os.path.join(evaluation_uri, "test")
    if not fileio.exists(folder):
        return None
    return {**metrics(folder), "confusion": confusion_matrix(folder), "views": views(folder)}


def accuracy_threshold(evaluation_uri: str) -> Optional[float]:
    """The accuracy the Evaluator blessed at, from the eval config it saved."""
    import json

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
