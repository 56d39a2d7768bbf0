"""A single-label model's accuracy and cross-entropy as TFMA metrics computed in numpy, one eval image at a time.

Named in the eval config by `module` (eval_config.py), under the class names and metric names of Keras's
SparseCategoricalAccuracy and SparseCategoricalCrossentropy, whose figures they give: the blessing's threshold,
the baseline comparison and every reader of the evaluation are unchanged. TFMA wraps a Keras metric by building
and running TensorFlow graphs for each batch: 3.4 s of a 14 s Evaluator on 400 eval images (docs/benchmarks.md).
"""

from typing import List, Optional

import apache_beam as beam
import numpy as np
from tensorflow_model_analysis.metrics import metric_types, metric_util

EPSILON = 1e-7  # Keras's: probabilities are clipped to [EPSILON, 1 - EPSILON] before the logarithm


def _correct(label_id: int, probabilities: np.ndarray) -> float:
    """1 where the most probable class (the first of ties, as numpy's and Keras's argmax) is the label."""
    return float(int(np.argmax(probabilities)) == label_id)


def _cross_entropy(label_id: int, probabilities: np.ndarray) -> float:
    """-log of the label's probability, clipped and renormalised as Keras does; a label the model does not know
    (Transform's id -1) counts as probability EPSILON."""
    clipped = np.clip(probabilities, EPSILON, 1 - EPSILON)
    known = 0 <= label_id < clipped.size
    return float(-np.log(clipped[label_id] / clipped.sum() if known else EPSILON))


class _MeanCombiner(beam.CombineFn):
    """The example-weighted mean of a figure of (label id, probabilities) over the eval images."""

    def __init__(self, key: metric_types.MetricKey, per_example, eval_config):
        self._key, self._per_example, self._eval_config = key, per_example, eval_config

    def create_accumulator(self) -> List[float]:
        return [0.0, 0.0]  # the weighted sum, the weights

    def add_input(self, accumulator: List[float], element: metric_types.StandardMetricInputs) -> List[float]:
        for label, probabilities, weight in metric_util.to_label_prediction_example_weight(
            element,
            eval_config=self._eval_config,
            model_name=self._key.model_name,
            output_name=self._key.output_name,
            example_weighted=self._key.example_weighted,
            flatten=False,
            require_single_example_weight=True,
        ):
            label_id = int(np.argmax(label)) if label.size > 1 else int(np.asarray(label).item())
            weight = metric_util.safe_to_scalar(weight)
            accumulator[0] += weight * self._per_example(label_id, np.asarray(probabilities, np.float64))
            accumulator[1] += weight
        return accumulator

    def merge_accumulators(self, accumulators) -> List[float]:
        merged = self.create_accumulator()
        for total, weights in accumulators:
            merged[0] += total
            merged[1] += weights
        return merged

    def extract_output(self, accumulator: List[float]) -> metric_types.MetricsDict:
        total, weights = accumulator
        return {self._key: total / weights if weights else float("nan")}


def _computations(per_example):
    """TFMA's computations function for a mean of `per_example`."""

    def computations(
        name: str,
        eval_config=None,
        model_name: str = "",
        output_name: str = "",
        example_weighted: bool = False,
        sub_key: Optional[metric_types.SubKey] = None,
    ) -> metric_types.MetricComputations:
        key = metric_types.MetricKey(
            name=name,
            model_name=model_name,
            output_name=output_name,
            sub_key=sub_key,
            example_weighted=example_weighted,
        )
        return [
            metric_types.MetricComputation(
                keys=[key], preprocessors=None, combiner=_MeanCombiner(key, per_example, eval_config)
            )
        ]

    return metric_util.merge_per_key_computations(computations)


class SparseCategoricalAccuracy(metric_types.Metric):
    """The share of eval images whose most probable class is their label."""

    def __init__(self, name: str = "sparse_categorical_accuracy"):
        super().__init__(_computations(_correct), name=name)


class SparseCategoricalCrossentropy(metric_types.Metric):
    """The mean of -log(the label's probability) over the eval images."""

    def __init__(self, name: str = "sparse_categorical_crossentropy"):
        super().__init__(_computations(_cross_entropy), name=name)
