"""The ModelCard component (the Pusher puts its files beside the model it pushes: components/pusher).

ModelCard(model=trainer.outputs["model"], model_run=trainer.outputs["model_run"],
          evaluation=evaluator.outputs["evaluation"], blessing=evaluator.outputs["blessing"],
          examples=example_gen.outputs["examples"], ingestion_report=example_gen.outputs["report"],
          health=<DataHealth's report>, baseline_model=<the latest blessed model>, pipeline=NAME)
  outputs["model_card"]   ModelCard: model_card.json, .md, .html, threshold.json
"""

from typing import Optional

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.model_card import executor
from storage.artifact_types import DataHealthReport, ImageIngestionReport
from storage.artifact_types import ModelCard as ModelCardArtifact


class ModelCardSpec(types.ComponentSpec):
    PARAMETERS = {"pipeline": ExecutionParameter(type=str)}
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "model_run": ChannelParameter(type=standard_artifacts.ModelRun),
        "evaluation": ChannelParameter(type=standard_artifacts.ModelEvaluation),
        "blessing": ChannelParameter(type=standard_artifacts.ModelBlessing),
        "examples": ChannelParameter(type=standard_artifacts.Examples),
        "ingestion_report": ChannelParameter(type=ImageIngestionReport),
        "health": ChannelParameter(type=DataHealthReport, optional=True),
        "baseline_model": ChannelParameter(type=standard_artifacts.Model, optional=True),
    }
    OUTPUTS = {executor.OUTPUT: ChannelParameter(type=ModelCardArtifact)}


class ModelCard(base_component.BaseComponent):
    SPEC_CLASS = ModelCardSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        trainer: base_component.BaseComponent,
        evaluator: base_component.BaseComponent,
        example_gen: base_component.BaseComponent,
        pipeline: str,
        health: Optional[types.BaseChannel] = None,
        baseline_model: Optional[types.BaseChannel] = None,
    ):
        """The card of `trainer`'s model (and its run), as `evaluator` judged it, on `example_gen`'s examples and
        ingestion report."""
        super().__init__(
            spec=ModelCardSpec(
                model=trainer.outputs["model"],
                model_run=trainer.outputs["model_run"],
                evaluation=evaluator.outputs["evaluation"],
                blessing=evaluator.outputs["blessing"],
                examples=example_gen.outputs["examples"],
                ingestion_report=example_gen.outputs["report"],
                health=health,
                baseline_model=baseline_model,
                pipeline=pipeline,
                model_card=types.Channel(type=ModelCardArtifact),
            )
        )
