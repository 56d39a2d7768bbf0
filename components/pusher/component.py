"""The Pusher: TFX's, and a blessed model is pushed with its card's files in its folder (`imagepipe predict` reads
threshold.json there), each version whole or not at all (components/pusher/__init__.py).

    ImagePusher(model=..., model_blessing=..., model_card=card.outputs["model_card"], push_destination=...)

On Vertex AI serving the pipeline uses TFX's Vertex Pusher instead (pipeline/pipeline.py).
"""

import json
import os
import re
import uuid
from typing import Optional

from tfx import types
from tfx.components.pusher import executor as pusher_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.dsl.io import fileio
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter
from tfx.utils import io_utils, json_utils, proto_utils

from components.model_card import FILES
from components.pusher import PUSH_COMPLETE, STAGING_PREFIX
from storage.artifact_types import ModelCard as ModelCardArtifact


class PusherExecutor(pusher_executor.Executor):
    """TFX's Pusher into a staging folder beside the versions, the card's files added, PUSH_COMPLETE written last,
    then the version moved into place: a reader (`imagepipe predict`, a model server) never sees a version without
    its thresholds. Locally the move is one rename; on an object store, where a folder cannot be renamed, the
    version's files are copied and PUSH_COMPLETE is written last (complete_version() looks for it)."""

    def Do(self, input_dict, output_dict, exec_properties):
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.PUSH_DESTINATION_KEY], destination)
        base = destination.filesystem.base_directory
        staging = f"{base.rstrip('/')}/{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        destination.filesystem.base_directory = staging
        staged_properties = {
            **exec_properties,
            standard_component_specs.PUSH_DESTINATION_KEY: proto_utils.proto_to_json(destination),
        }
        try:
            super().Do(input_dict, output_dict, staged_properties)
            pushed = artifact_utils.get_single_instance(output_dict[standard_component_specs.PUSHED_MODEL_KEY])
            if not pushed.get_int_custom_property("pushed"):
                return
            staged = pushed.get_string_custom_property("pushed_destination")
            version = pushed.get_string_custom_property("pushed_version")
            card = (input_dict.get("model_card") or [None])[0]
            for folder in (staged, pushed.uri):
                for name in FILES if card is not None else ():
                    fileio.copy(f"{card.uri}/{name}", f"{folder.rstrip('/')}/{name}", overwrite=True)
            final = f"{base.rstrip('/')}/{version}"
            _move_version(staged, final, version)
            pushed.set_string_custom_property("pushed_destination", final)
        finally:
            if fileio.exists(staging):
                fileio.rmtree(staging)


def _move_version(staged: str, final: str, version: str) -> None:
    """The staged version into place, PUSH_COMPLETE written last; a version of that name already there (pushed in
    the same second) is kept as it is, as TFX's Pusher keeps it."""
    marker = json.dumps({"version": version}).encode()
    if fileio.exists(final):
        return
    if "://" in final:  # the files a reader looks for come last: the SavedModel's graph and the card's files
        last = ["saved_model.pb", *FILES]
        io_utils.copy_dir(staged, final, deny_regex_patterns=[re.escape(f"{staged}/{name}") + "$" for name in last])
        for name in last:
            if fileio.exists(f"{staged}/{name}"):
                io_utils.copy_file(f"{staged}/{name}", f"{final}/{name}")
        io_utils.write_bytes_file(f"{final}/{PUSH_COMPLETE}", marker)
        return
    io_utils.write_bytes_file(f"{staged}/{PUSH_COMPLETE}", marker)
    os.rename(staged, final)  # one step: whole or not at all


class ImagePusherSpec(standard_component_specs.PusherSpec):
    INPUTS = {
        **standard_component_specs.PusherSpec.INPUTS,
        "model_card": ChannelParameter(type=ModelCardArtifact, optional=True),
    }


class ImagePusher(base_component.BaseComponent):
    SPEC_CLASS = ImagePusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(PusherExecutor)

    def __init__(
        self,
        model: types.BaseChannel,
        model_blessing: types.BaseChannel,
        push_destination,
        model_card: Optional[types.BaseChannel] = None,
    ):
        super().__init__(
            spec=ImagePusherSpec(
                model=model,
                model_blessing=model_blessing,
                model_card=model_card,
                push_destination=push_destination,
                custom_config=json_utils.dumps(None),
                pushed_model=types.Channel(type=standard_artifacts.PushedModel),
            )
        )
