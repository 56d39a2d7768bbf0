"""The Pusher: TFX's, and a blessed model is pushed with its card's files in its folder (`imagepipe predict` reads
threshold.json there).

    ImagePusher(model=..., model_blessing=..., model_card=card.outputs["model_card"], push_destination=...)

On Vertex AI serving the pipeline uses TFX's Vertex Pusher instead (pipeline/pipeline.py).
"""

from typing import Optional

from tfx import types
from tfx.components.pusher import executor as pusher_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter
from tfx.utils import json_utils

from components.model_card import FILES
from storage.artifact_types import ModelCard as ModelCardArtifact


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
