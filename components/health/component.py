"""The DataHealth component (docs/validation-and-health.md: Data health).

    DataHealth(ingestion_report=example_gen.outputs["report"], transformed_examples=..., transform_graph=...,
               features=<BackboneFeatures' output, transfer models>, baseline_model=<latest blessed model>,
               hparams=HParams(...).to_custom_config(), label_check="auto", max_eval_near_duplicates=1.0,
               max_label_issues=1.0, max_feature_drift=...)
      outputs["health"]   DataHealthReport: health.json (with the checks over their limits), label_issues.csv,
                          outliers.csv

It runs before the Trainer; DataHealthGate (gate.py) reads its problems and stops the run (or warns).
"""

import json
from typing import Any, Dict, Optional

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.health import executor
from storage.artifact_types import DataHealthReport, ImageIngestionReport


class DataHealthSpec(types.ComponentSpec):
    PARAMETERS = {
        "hparams": ExecutionParameter(type=str),
        "label_check": ExecutionParameter(type=str),
        "max_eval_near_duplicates": ExecutionParameter(type=float),
        "max_label_issues": ExecutionParameter(type=float),
        "max_feature_drift": ExecutionParameter(type=float),
    }
    INPUTS = {
        "ingestion_report": ChannelParameter(type=ImageIngestionReport),
        "transformed_examples": ChannelParameter(type=standard_artifacts.Examples),
        "transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph),
        "features": ChannelParameter(type=standard_artifacts.Examples, optional=True),
        "baseline_model": ChannelParameter(type=standard_artifacts.Model, optional=True),
    }
    OUTPUTS = {"health": ChannelParameter(type=DataHealthReport)}


class DataHealth(base_component.BaseComponent):
    SPEC_CLASS = DataHealthSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, ingestion_report: types.BaseChannel, transformed_examples: types.BaseChannel,
                 transform_graph: types.BaseChannel, hparams: Dict[str, Any], label_check: str,
                 max_eval_near_duplicates: float, max_label_issues: float, max_feature_drift: float,
                 features: Optional[types.BaseChannel] = None,
                 baseline_model: Optional[types.BaseChannel] = None):
        super().__init__(spec=DataHealthSpec(
            ingestion_report=ingestion_report, transformed_examples=transformed_examples,
            transform_graph=transform_graph, features=features, baseline_model=baseline_model,
            hparams=json.dumps(hparams, sort_keys=True), label_check=label_check,
            max_eval_near_duplicates=max_eval_near_duplicates, max_label_issues=max_label_issues,
            max_feature_drift=max_feature_drift,
            health=types.Channel(type=DataHealthReport)))
