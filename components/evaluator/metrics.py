"""Per-class recall and precision, and balanced accuracy, as TFMA metrics: what the Evaluator blesses on besides
accuracy, so that a model that misses a class is never blessed (docs/training.md: Imbalanced data).

    ClassRecall       per class (a MetricsSpec's binarize class_ids): the share of the class's eval images
                      whose top prediction is the class
    ClassPrecision    per class: the share of the images predicted as the class that are of it
    MeanClassRecall   balanced accuracy: the mean of ClassRecall over the classes that have eval images (macro-averaged recall)

All three are derived from one multi-class confusion matrix of argmax predictions (TFMA's own combiner), so
they agree with the confusion matrix the report draws. TFMA's built-in Recall and Precision cannot give these:
per class they binarize at a probability of 0.5 (not the top prediction), and their macro average does not
take top-k predictions.

The Evaluator (components/evaluator/executor.py) adds them to the eval config once it knows the model's classes
and the eval split's counts (class_specs): TFMA then checks every class with enough eval images against
--min-class-recall, and on imbalanced data compares balanced accuracy, not accuracy, with the last blessed
model.
"""

from typing import Dict, List, Optional, Sequence

from tensorflow_model_analysis.metrics import metric_types, metric_util
from tensorflow_model_analysis.metrics.multi_class_confusion_matrix_metrics import (
    MatrixEntryKey,
    multi_class_confusion_matrices,
)
from tensorflow_model_analysis.proto import config_pb2 as tfma_config

MODULE = __name__
CLASS_RECALL, CLASS_PRECISION, BALANCED_ACCURACY = "class_recall", "class_precision", "balanced_accuracy"
# A combiner of its own (TFMA keys computations by name): argmax predictions, every example given a class.
_MATRIX = "_imagepipe_argmax_confusion_matrix"


def _matrix(eval_config, model_name: str, output_name: str, example_weighted: bool):
    computations = multi_class_confusion_matrices(
        thresholds=[0.0],
        name=_MATRIX,
        eval_config=eval_config,
        model_name=model_name,
        output_name=output_name,
        example_weighted=example_weighted,
    )
    return computations, computations[-1].keys[-1]


def _counts(matrices) -> Dict[int, Dict[int, float]]:
    """{actual class id: {predicted class id: count}} from TFMA's Matrices at threshold 0."""
    found: Dict[int, Dict[int, float]] = {}
    for entry, count in matrices[0.0].items():
        key = MatrixEntryKey(*entry) if not isinstance(entry, MatrixEntryKey) else entry
        found.setdefault(key.actual_class_id, {})[key.predicted_class_id] = count
    return found


def recall_of(counts: Dict[int, Dict[int, float]], class_id: int) -> float:
    row = counts.get(class_id, {})
    total = sum(row.values())
    return row.get(class_id, 0.0) / total if total else float("nan")


def precision_of(counts: Dict[int, Dict[int, float]], class_id: int) -> float:
    predicted = sum(row.get(class_id, 0.0) for row in counts.values())
    return counts.get(class_id, {}).get(class_id, 0.0) / predicted if predicted else float("nan")


def balanced_accuracy_of(counts: Dict[int, Dict[int, float]]) -> float:
    """The mean recall over the classes with eval examples (an example with no label id is left out)."""
    recalls = [recall_of(counts, c) for c, row in counts.items() if c >= 0 and sum(row.values())]
    return sum(recalls) / len(recalls) if recalls else float("nan")


def _per_class(
    of,
    name: str,
    eval_config=None,
    model_name: str = "",
    output_name: str = "",
    sub_key: Optional[metric_types.SubKey] = None,
    example_weighted: bool = False,
):
    if sub_key is None or sub_key.class_id is None:
        raise ValueError(f"{name} is per class: give its MetricsSpec binarize class_ids")
    computations, matrix_key = _matrix(eval_config, model_name, output_name, example_weighted)
    key = metric_types.MetricKey(
        name=name, model_name=model_name, output_name=output_name, sub_key=sub_key, example_weighted=example_weighted
    )
    computations.append(
        metric_types.DerivedMetricComputation(
            keys=[key], result=lambda metrics: {key: of(_counts(metrics[matrix_key]), sub_key.class_id)}
        )
    )
    return computations


# TFMA passes a computation function only the arguments its signature names: each is spelled out.
def _class_recall(
    name: str = CLASS_RECALL,
    eval_config=None,
    model_name: str = "",
    output_name: str = "",
    sub_key=None,
    example_weighted: bool = False,
):
    return _per_class(recall_of, name, eval_config, model_name, output_name, sub_key, example_weighted)


def _class_precision(
    name: str = CLASS_PRECISION,
    eval_config=None,
    model_name: str = "",
    output_name: str = "",
    sub_key=None,
    example_weighted: bool = False,
):
    return _per_class(precision_of, name, eval_config, model_name, output_name, sub_key, example_weighted)


def _balanced_accuracy(
    name: str = BALANCED_ACCURACY,
    eval_config=None,
    model_name: str = "",
    output_name: str = "",
    sub_key=None,
    example_weighted: bool = False,
):
    computations, matrix_key = _matrix(eval_config, model_name, output_name, example_weighted)
    key = metric_types.MetricKey(
        name=name, model_name=model_name, output_name=output_name, example_weighted=example_weighted
    )
    computations.append(
        metric_types.DerivedMetricComputation(
            keys=[key], result=lambda metrics: {key: balanced_accuracy_of(_counts(metrics[matrix_key]))}
        )
    )
    return computations


class ClassRecall(metric_types.Metric):
    def __init__(self, name: str = CLASS_RECALL):
        super().__init__(metric_util.merge_per_key_computations(_class_recall), name=name)


class ClassPrecision(metric_types.Metric):
    def __init__(self, name: str = CLASS_PRECISION):
        super().__init__(metric_util.merge_per_key_computations(_class_precision), name=name)


class MeanClassRecall(metric_types.Metric):
    """Balanced accuracy (TFMA's own BalancedAccuracy, registered under that class name, is binary)."""

    def __init__(self, name: str = BALANCED_ACCURACY):
        super().__init__(metric_util.merge_per_key_computations(_balanced_accuracy), name=name)


# The recall a class with a few eval images must exceed: above 0, one image found (TFMA's bound is inclusive).
FOUND_ONE = 1e-9


def _floor(value: float):
    return tfma_config.MetricThreshold(value_threshold=tfma_config.GenericValueThreshold(lower_bound={"value": value}))


def class_specs(
    eval_examples: Sequence[int],
    judged: Sequence[int],
    min_class_recall: float,
    compare_balanced: bool,
    must_find: Sequence[int] = (),
) -> List:
    """The MetricsSpecs the Evaluator adds for a model of len(eval_examples) classes: recall and precision of
    every class, recall bounded below by min_class_recall for the `judged` class ids and above 0 for the
    `must_find` ones, and balanced accuracy (with the change threshold against the last blessed model when
    `compare_balanced`)."""

    def metric(class_name: str, threshold=None):
        return tfma_config.MetricConfig(class_name=class_name, module=MODULE, threshold=threshold)

    def classes(ids):
        return tfma_config.BinarizationOptions(class_ids=tfma_config.RepeatedInt32Value(values=list(ids)))

    judged, must_find = sorted(set(judged)), sorted(set(must_find) - set(judged))
    others = [c for c in range(len(eval_examples)) if c not in judged and c not in must_find]
    specs = [
        tfma_config.MetricsSpec(
            metrics=[
                metric(
                    "MeanClassRecall",
                    tfma_config.MetricThreshold(
                        change_threshold=tfma_config.GenericChangeThreshold(
                            direction=tfma_config.MetricDirection.HIGHER_IS_BETTER, absolute={"value": -1e-10}
                        )
                    )
                    if compare_balanced
                    else None,
                )
            ]
        )
    ]
    if judged:
        specs.append(
            tfma_config.MetricsSpec(
                metrics=[metric("ClassRecall", _floor(min_class_recall)), metric("ClassPrecision")],
                binarize=classes(judged),
            )
        )
    if must_find:
        specs.append(
            tfma_config.MetricsSpec(
                metrics=[metric("ClassRecall", _floor(FOUND_ONE)), metric("ClassPrecision")],
                binarize=classes(must_find),
            )
        )
    if others:
        specs.append(
            tfma_config.MetricsSpec(metrics=[metric("ClassRecall"), metric("ClassPrecision")], binarize=classes(others))
        )
    return specs
