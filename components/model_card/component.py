"""The ModelCard component, and the Pusher that puts the card beside the model it pushes.

    ModelCard(model=trainer.outputs["model"], model_run=trainer.outputs["model_run"],
              evaluation=evaluator.outputs["evaluation"], blessing=evaluator.outputs["blessing"],
              examples=example_gen.outputs["examples"], ingestion_report=example_gen.outputs["report"],
              health=<DataHealth's report>, baseline_model=<the latest blessed model>, pipeline=NAME)
      outputs["model_card"]   ModelCard: model_card.json, .md, .html, threshold.json

    ImagePusher(model=..., model_blessing=..., model_card=card.outputs["model_card"], push_destination=...)
      TFX's Pusher; a blessed model is pushed with the card's files in its folder (imagepipe predict reads
      threshold.json there).
"""

from typing import Optional

from tfx import types
from tfx.components.pusher import executor as pusher_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.utils import json_utils

from components.artifacts import DataHealthReport, ImageIngestionReport, ModelCard as ModelCardArtifact
from components.model_card import FILES, executor


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

    def __init__(self, model: types.BaseChannel, model_run: types.BaseChannel, evaluation: types.BaseChannel,
                 blessing: types.BaseChannel, examples: types.BaseChannel, ingestion_report: types.BaseChannel,
                 pipeline: str, health: Optional[types.BaseChannel] = None,
                 baseline_model: Optional[types.BaseChannel] = None):
        super().__init__(spec=ModelCardSpec(
            model=model, model_run=model_run, evaluation=evaluation, blessing=blessing, examples=examples,
            ingestion_report=ingestion_report, health=health, baseline_model=baseline_model, pipeline=pipeline,
            model_card=types.Channel(type=ModelCardArtifact)))


class PusherExecutor(pusher_executor.Executor):
    """TFX's Pusher; then the card's files go into the pushed model's folder and the pushed_model artifact."""

    def Do(self, input_dict, output_dict, exec_properties):
        super().Do(input_dict, output_dict, exec_properties)
        pushed = artifact_utils.get_single_instance(output_dict[standard_component_specs.PUSHED_MODEL_KEY])
        card = (input_dict.get("model_card") or [None])[0]
        if card is None or not pushed.get_int_custom_property("pushed"):
            return
        destination = pushed.get_string_custom_property("pushed_destination")
        for folder in (destination, pushed.uri):
            for name in FILES:
                fileio.copy(f"{card.uri}/{name}", f"{folder.rstrip('/')}/{name}", overwrite=True)


class ImagePusherSpec(standard_component_specs.PusherSpec):
    INPUTS = {**standard_component_specs.PusherSpec.INPUTS,
              "model_card": ChannelParameter(type=ModelCardArtifact, optional=True)}


class ImagePusher(base_component.BaseComponent):
    SPEC_CLASS = ImagePusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(PusherExecutor)

    def __init__(self, model: types.BaseChannel, model_blessing: types.BaseChannel, push_destination,
                 model_card: Optional[types.BaseChannel] = None):
        super().__init__(spec=ImagePusherSpec(
            model=model, model_blessing=model_blessing, model_card=model_card, push_destination=push_destination,
            custom_config=json_utils.dumps(None), pushed_model=types.Channel(type=standard_artifacts.PushedModel)))
