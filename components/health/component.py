"""The DataHealth component (docs/validation-and-health.md: Data health).

    DataHealth(ingestion_report=example_gen.outputs["report"], transformed_examples=..., transform_graph=...,
               features=<BackboneFeatures' output, transfer models>, baseline_model=<latest blessed model>,
               hparams=HParams(...).to_custom_config(), label_check="auto", limits=Limits(...))
      outputs["health"]   DataHealthReport: health.json (with the checks over their limits), label_issues.csv,
                          outliers.csv

It runs before the Trainer; DataHealthGate (gate.py) reads its problems and stops the run (or warns).
"""

import dataclasses
import json
from typing import Any, Dict, Optional

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.health import Limits, executor
from storage.artifact_types import DataHealthReport, ImageIngestionReport


class DataHealthSpec(types.ComponentSpec):
    PARAMETERS = {
        "hparams": ExecutionParameter(type=str),
        "label_check": ExecutionParameter(type=str),
        **{f.name: ExecutionParameter(type=float) for f in dataclasses.fields(Limits)},  # one parameter a limit
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
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(
        self,
        ingestion_report: types.BaseChannel,
        transformed_examples: types.BaseChannel,
        transform_graph: types.BaseChannel,
        hparams: Dict[str, Any],
        label_check: str,
        limits: Limits,
        features: Optional[types.BaseChannel] = None,
        baseline_model: Optional[types.BaseChannel] = None,
    ):
        super().__init__(
            spec=DataHealthSpec(
                ingestion_report=ingestion_report,
                transformed_examples=transformed_examples,
                transform_graph=transform_graph,
                features=features,
                baseline_model=baseline_model,
                hparams=json.dumps(hparams, sort_keys=True),
                label_check=label_check,
                **dataclasses.asdict(limits),
                health=types.Channel(type=DataHealthReport),
            )
        )
