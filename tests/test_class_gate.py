"""The Evaluator's gate on every class (components/evaluator/metrics.py, components/evaluator/executor.py): TFMA
computes each class's recall and precision and balanced accuracy, and blesses only when every class with enough
eval images reaches --min-class-recall; run on real TFMA (its Beam pipeline over a DataFrame)."""

import json

import numpy as np
import pandas as pd
import pytest
import tensorflow_model_analysis as tfma
from tensorflow_model_analysis.proto import config_pb2 as tfma_config
from tfx.types import standard_component_specs
from tfx.utils import proto_utils

from components.evaluator import executor as model_evaluator
from components.evaluator import metrics as evaluation_metrics
from components.evaluator import results as evaluation_results
from components.evaluator.eval_config import MIN_CLASS_RECALL
from pipeline.pipeline import eval_config


def _predictions():
    """400 ok, 16 defect, 4 scratch: ok always right, 4 of 16 defects found, no scratch found."""
    labels = np.array([0] * 400 + [1] * 16 + [2] * 4)
    probabilities = np.tile([0.8, 0.15, 0.05], (420, 1))
    probabilities[400:404] = [0.1, 0.85, 0.05]
    return pd.DataFrame({"label": labels, "prediction": list(probabilities)})


def test_a_class_below_the_floor_fails_the_blessing_in_one_line_naming_it(tmp_path):
    names, counts = ["ok", "defect", "scratch"], {"ok": 400, "defect": 16, "scratch": 4}
    config = eval_config(accuracy_threshold=0.9)
    config.model_specs[0].CopyFrom(tfma_config.ModelSpec(label_key="label", prediction_key="prediction"))
    properties = {standard_component_specs.EVAL_CONFIG_KEY: proto_utils.proto_to_json(config), MIN_CLASS_RECALL: 0.5}
    properties, gate = model_evaluator.with_class_checks(
        properties, names, counts, {"ok": 1600, "defect": 64, "scratch": 16}
    )
    assert gate["judged"] == [0, 1]  # scratch: 4 eval images, too few to judge its recall...
    assert gate["must_find"] == [2]  # ... but enough that a model finding none of them misses the class
    assert gate["imbalanced"] and gate["compared_on"] == "balanced_accuracy"
    config = proto_utils.json_to_proto(properties[standard_component_specs.EVAL_CONFIG_KEY], tfma_config.EvalConfig())
    accuracy = next(m for s in config.metrics_specs for m in s.metrics if m.class_name == "SparseCategoricalAccuracy")
    assert not accuracy.threshold.HasField("change_threshold")  # compared on balanced accuracy instead
    balanced = next(m for s in config.metrics_specs for m in s.metrics if m.class_name == "MeanClassRecall")
    assert balanced.threshold.change_threshold.direction == tfma_config.MetricDirection.HIGHER_IS_BETTER
    balanced.threshold.ClearField("change_threshold")  # a first run: no baseline (TFX ignores change thresholds)

    out = tmp_path / "evaluation"
    tfma.analyze_raw_data(_predictions(), config, output_path=str(out))
    (out / "class_gate.json").write_text(json.dumps(gate))
    found = evaluation_results.metrics(str(out))
    assert found["accuracy"] == pytest.approx(404 / 420)  # high: the majority class is always right
    assert found["balanced_accuracy"] == pytest.approx((1 + 4 / 16 + 0) / 3)
    assert found["per_class"]["defect"] == {"recall": 0.25, "precision": 1.0, "support": 16}
    assert found["per_class"]["scratch"]["recall"] == 0.0 and found["per_class"]["scratch"]["precision"] is None
    assert found["per_class"]["ok"]["precision"] == pytest.approx(400 / 416)
    assert sorted(found["failures"]) == [
        "class 'defect' recall 0.25 < 0.50 (16 eval images) (--min-class-recall)",
        "class 'scratch' recall 0.00: none of its 4 eval images found (--min-class-recall)",
    ]
    weakest = evaluation_results.weakest_class(found)
    assert (weakest["name"], weakest["judged"]) == ("scratch", False)


def test_balanced_data_keeps_comparing_on_accuracy_and_a_zero_floor_judges_no_class():
    config = eval_config(accuracy_threshold=0.9)
    properties = {standard_component_specs.EVAL_CONFIG_KEY: proto_utils.proto_to_json(config), MIN_CLASS_RECALL: 0.0}
    properties, gate = model_evaluator.with_class_checks(
        properties, ["a", "b"], {"a": 50, "b": 48}, {"a": 200, "b": 190}
    )
    assert (gate["judged"], gate["must_find"], gate["imbalanced"], gate["compared_on"]) == ([], [], False, "accuracy")
    config = proto_utils.json_to_proto(properties[standard_component_specs.EVAL_CONFIG_KEY], tfma_config.EvalConfig())
    accuracy = next(m for s in config.metrics_specs for m in s.metrics if m.class_name == "SparseCategoricalAccuracy")
    assert accuracy.threshold.HasField("change_threshold")
    recall_specs = [s for s in config.metrics_specs if any(m.class_name == "ClassRecall" for m in s.metrics)]
    assert all(not m.HasField("threshold") for s in recall_specs for m in s.metrics)  # computed, not gated
    assert evaluation_metrics.balanced_accuracy_of({0: {0: 3, 1: 1}, 1: {1: 2}}) == pytest.approx((0.75 + 1) / 2)


def test_accuracy_and_cross_entropy_are_keras_figures_computed_without_tensorflow(tmp_path):
    """TFMA runs them in numpy (components/evaluator/sparse_metrics.py) under Keras's names: the same figures as
    keras.metrics on awkward rows (ties, a label's probability 0, rows not summing to 1)."""
    import keras

    rng = np.random.default_rng(7)
    probabilities = rng.dirichlet([0.5, 0.5, 0.5], size=300)
    probabilities[:20] = [0.4, 0.4, 0.2]  # ties: the first class wins, as argmax
    probabilities[20:30] = [0.0, 1.0, 0.0]  # the label's probability 0 below: clipped, not infinite
    probabilities[30:40] *= 0.9  # sums below 1: renormalised
    labels = rng.integers(0, 3, size=300)
    labels[20:30] = 0
    config = eval_config(accuracy_threshold=0.1)
    assert {m.module for s in config.metrics_specs for m in s.metrics if m.class_name.startswith("Sparse")} == {
        "components.evaluator.sparse_metrics"
    }
    config.model_specs[0].CopyFrom(tfma_config.ModelSpec(label_key="label", prediction_key="prediction"))
    for spec in config.metrics_specs:
        for metric in spec.metrics:
            metric.threshold.ClearField("change_threshold")  # a first run: no baseline
    out = tmp_path / "evaluation"
    frame = pd.DataFrame({"label": labels, "prediction": list(probabilities.astype(np.float32))})
    tfma.analyze_raw_data(frame, config, output_path=str(out))
    found = {
        kv.key.name: kv.value.double_value.value
        for metrics in tfma.load_metrics(str(out))
        for kv in metrics.metric_keys_and_values
        if not kv.key.HasField("sub_key")
    }
    keras_accuracy = float(keras.metrics.SparseCategoricalAccuracy()(labels, probabilities.astype(np.float32)))
    keras_loss = float(keras.metrics.SparseCategoricalCrossentropy()(labels, probabilities.astype(np.float32)))
    assert found["sparse_categorical_accuracy"] == pytest.approx(keras_accuracy, rel=1e-6)
    assert found["sparse_categorical_crossentropy"] == pytest.approx(keras_loss, rel=1e-5)
    assert keras_loss > 1.0  # the zero-probability rows count, clipped at Keras's epsilon
