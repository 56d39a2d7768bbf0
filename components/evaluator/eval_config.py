"""The Evaluator's settings: its parameters' names, and the TFMA configuration of a single-label model (a
multi-label model's is rewritten from it: multi_label.eval_config_for)."""

import json
from typing import Any, Dict, Optional, Sequence

from components.evaluator import views as evaluation_views
from trainer import class_balance

INFERENCE_BATCH = 64  # eval images TFMA gives a model call (each call decodes its images whole)

BASELINE_SKIPPED = "baseline_skipped"  # custom property of the blessing: why no baseline was compared
THRESHOLD = "accuracy_threshold"  # the Evaluator's own parameter (components/evaluator/component.py)
CONFIDENCE, TARGET_PRECISION = "confidence_threshold", "target_precision"  # its parameters for views.json
MIN_CLASS_RECALL = "min_class_recall"  # its parameter: the recall every judged class must reach
EXPLANATIONS = "explanations"  # its parameter: eval images explained (components/evaluator/explanations.py; 0: none)
CLASS_GATE_FILE = "class_gate.json"  # in the evaluation: the classes judged, their counts, what was compared
EVALUATED_ON_FILE = "evaluated_on.json"  # in the evaluation: what TFMA scored (components/evaluator/on_features.py)
TEST_SPLIT = "test"
ACCURACY_METRIC = "SparseCategoricalAccuracy"  # the metric whose lower bound it sets (eval_config below)
SPARSE_METRICS = "components.evaluator.sparse_metrics"  # the module of the accuracy and cross-entropy TFMA computes


def eval_config(accuracy_threshold: float, confidence_threshold: Optional[float] = None):
    """Accuracy gates the blessing: above the threshold, and no worse than the baseline (a tfma.EvalConfig).

    The model's own `transform_features` signature turns raw eval examples into its label ids
    (each model has its own vocabulary), so candidate and baseline are each scored consistently.
    """
    # Here, not at the top: the constants above are read by plain-Python code (multi_label's gate, the summary)
    from tensorflow_model_analysis.proto import config_pb2 as tfma_config

    # trainer.features imports TensorFlow: the same reason
    from trainer.features import LABEL_KEY

    accuracy = tfma_config.MetricConfig(
        class_name=ACCURACY_METRIC,  # its lower bound: the accuracy_threshold runtime parameter
        module=SPARSE_METRICS,
        threshold=tfma_config.MetricThreshold(
            value_threshold=tfma_config.GenericValueThreshold(lower_bound={"value": accuracy_threshold}),
            # Ignored on the first run, when there is no blessed baseline yet.
            change_threshold=tfma_config.GenericChangeThreshold(
                direction=tfma_config.MetricDirection.HIGHER_IS_BETTER, absolute={"value": -1e-10}
            ),
        ),
    )
    # Per-class precision and recall come from the confusion matrix (run_summary.per_class_metrics):
    # binarizing by class id would need the class count before the data is read, and fail when
    # a class has no valid image.
    specs = [
        tfma_config.MetricsSpec(
            metrics=[
                tfma_config.MetricConfig(class_name="ExampleCount"),
                accuracy,
                tfma_config.MetricConfig(class_name="SparseCategoricalCrossentropy", module=SPARSE_METRICS),
                # At confidence thresholds: precision, recall and coverage as the threshold moves, overall and per class
                # (components/evaluator/views.py; threshold 0 is the plain argmax confusion matrix).
                tfma_config.MetricConfig(
                    class_name="MultiClassConfusionMatrixPlot",
                    config=json.dumps({"thresholds": evaluation_views.thresholds_with(confidence_threshold)}),
                ),
            ]
        )
    ]
    return tfma_config.EvalConfig(
        model_specs=[
            tfma_config.ModelSpec(
                signature_name="serving_examples",
                label_key=LABEL_KEY,
                prediction_key="probabilities",
                preprocessing_function_names=["transform_features"],
                inference_batch_size=INFERENCE_BATCH,
            )
        ],  # images a model call decodes at once
        slicing_specs=[tfma_config.SlicingSpec()],
        metrics_specs=specs,
    )


def min_class_recall(exec_properties) -> float:
    """The recall every judged class (or label) must reach: the Evaluator's parameter, or its default."""
    floor = exec_properties.get(MIN_CLASS_RECALL)
    return class_balance.MIN_CLASS_RECALL if floor is None else float(floor)


def class_gate(
    names: Sequence[str], eval_counts: Dict[str, int], train_counts: Dict[str, int], floor: float
) -> Dict[str, Any]:
    """class_gate.json's record of what is judged, for classes or labels alike: the eval and train counts, the ones
    judged on their recall (class_balance.MIN_EVAL_EXAMPLES eval images or more) and the small ones that must be
    found at least once (MIN_EVAL_TO_FIND or more); none when the floor is 0."""
    support = [int(eval_counts.get(name, 0)) for name in names]
    judged = [c for c, n in enumerate(support) if n >= class_balance.MIN_EVAL_EXAMPLES] if floor > 0 else []
    must_find = (
        [c for c, n in enumerate(support) if class_balance.MIN_EVAL_TO_FIND <= n < class_balance.MIN_EVAL_EXAMPLES]
        if floor > 0
        else []
    )
    return {
        "class_names": list(names),
        "eval_examples": support,
        "train_examples": [int(train_counts.get(n, 0)) for n in names],
        "min_class_recall": floor,
        "min_eval_examples": class_balance.MIN_EVAL_EXAMPLES,
        "judged": judged,
        "must_find": must_find,
        "min_eval_to_find": class_balance.MIN_EVAL_TO_FIND,
        "imbalance_ratio": class_balance.imbalance_ratio(train_counts),
        "imbalanced": class_balance.is_imbalanced(train_counts),
    }
