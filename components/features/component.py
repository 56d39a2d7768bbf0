"""The BackboneFeatures component (docs/benchmarks.md: Transfer learning that pays for the backbone once).

    BackboneFeatures(transformed_examples=transform.outputs["transformed_examples"],
                     hparams=HParams(...).features_config(), cache_dir="<root>/cache/features")
      outputs["features"]   Examples: Split-train/, Split-eval/ with `features`, `label`, `key`, and
                            source.json / summary.json (named in trainer/artifact_files.py and components/features/__init__.py)

A Beam component like the other data components: the DirectRunner locally, Dataflow when the
pipeline runs there. The Trainer takes its output as its examples.
"""

import json
from typing import Any, Dict

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.features import executor


class BackboneFeaturesSpec(types.ComponentSpec):
    PARAMETERS = {
        executor.HPARAMS_KEY: ExecutionParameter(type=str),  # HParams.features_config(), as JSON
        executor.CACHE_KEY: ExecutionParameter(type=str),
    }
    INPUTS = {executor.INPUT_KEY: ChannelParameter(type=standard_artifacts.Examples)}
    OUTPUTS = {executor.OUTPUT_KEY: ChannelParameter(type=standard_artifacts.Examples)}


class BackboneFeatures(base_beam_component.BaseBeamComponent):
    SPEC_CLASS = BackboneFeaturesSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, transformed_examples: types.BaseChannel, hparams: Dict[str, Any], cache_dir: str):
        super().__init__(
            spec=BackboneFeaturesSpec(
                transformed_examples=transformed_examples,
                hparams=json.dumps(hparams, sort_keys=True),
                cache_dir=cache_dir,
                features=types.Channel(type=standard_artifacts.Examples),
            )
        )
