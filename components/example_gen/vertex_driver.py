"""ImageExampleGen's pre-cache driver on Vertex AI / Kubeflow Pipelines v2.

Before the executor runs, Vertex runs a driver that resolves {SPAN} and
computes the input fingerprint that decides whether the cached result is
reused. TFX's file-based driver stats only what the input pattern's glob
matches: for a span folder, the folder itself, so images added to or replaced
in that folder would be silently ignored (a cached result reused). This driver
is TFX's, with the fingerprint the local driver takes (component.py): every
file the executor will read, with its label, split, size and modification time,
over the whole span window (the latest span and the span_window - 1 before it).
kubeflow/deploy.py compiles the pipeline with this module as ImageExampleGen's
driver command.
"""

import sys
from typing import Any, Dict, Optional

from absl import app
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2
from tfx.components.example_gen import input_processor
from tfx.components.example_gen import utils as example_gen_utils
from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils
from tfx.orchestration.kubeflow.v2.file_based_example_gen import driver as tfx_driver
from tfx.proto import example_gen_pb2
from tfx.types import standard_component_specs
from tfx.utils import proto_utils

from components.example_gen.ingest_settings import IngestSettings
from storage.errors import ConfigError, DataError, one_line

DRIVER_COMMAND = ("python", "-m", "components.example_gen.vertex_driver")


def input_fingerprint(exec_properties: Dict[str, Any], splits, span: int) -> str:
    """The fingerprint of what the executor reads for `span` (splits with the span filled in)."""
    resolved = dict(exec_properties)
    resolved[standard_component_specs.INPUT_CONFIG_KEY] = proto_utils.proto_to_json(
        example_gen_pb2.Input(splits=splits)
    )
    resolved[example_gen_utils.SPAN_PROPERTY_NAME] = span
    return IngestSettings.from_exec_properties(resolved).input_fingerprint()


class WindowInputProcessor(input_processor.FileBasedInputProcessor):
    """TFX's span resolution, with the fingerprint of every file of the resolved span window."""

    exec_properties: Dict[str, Any] = {}  # the component's parameters, set by main()

    def get_input_fingerprint(self, span: int, version: Optional[int]) -> str:
        splits = [
            example_gen_pb2.Input.Split(
                name=s.name, pattern=self.get_pattern_for_span_version(s.pattern, span, version)
            )
            for s in self._splits
        ]
        return input_fingerprint(self.exec_properties, splits, span)


def main(args) -> None:
    executor_input = pipeline_spec_pb2.ExecutorInput()
    json_format.Parse(args.json_serialized_invocation_args, executor_input, ignore_unknown_fields=True)
    inputs_spec = None
    if getattr(args, "json_serialized_inputs_spec_args", None):
        inputs_spec = pipeline_spec_pb2.ComponentInputsSpec()
        json_format.Parse(args.json_serialized_inputs_spec_args, inputs_spec, ignore_unknown_fields=True)
    WindowInputProcessor.exec_properties = kubeflow_v2_entrypoint_utils.parse_execution_properties(
        executor_input.inputs.parameter_values, executor_input.inputs.parameters, inputs_spec
    )
    # TFX's driver builds its input processor from this module attribute; this process exists
    # only to run that driver, so swapping the class here affects nothing else.
    tfx_driver.input_processor.FileBasedInputProcessor = WindowInputProcessor
    try:
        tfx_driver.main(args)
    except (ConfigError, DataError) as e:  # the task's log ends in one line, not a traceback around it
        sys.exit(f"imagepipe: error: {one_line(str(e))}")


if __name__ == "__main__":
    app.run(main, flags_parser=tfx_driver._parse_flags)  # pylint: disable=protected-access
