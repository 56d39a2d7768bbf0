"""The ImageTuner component: TFX's Tuner, with the last search as an input and the trials as a parameter.

    ImageTuner(examples=<features (transfer models) or Transform's examples>, transform_graph=...,
               ingestion_report=example_gen.outputs["report"], hparams={...}, previous=<latest tuner_results>,
               tune_trials=20 | RuntimeParameter, tune_mode="auto" | "search", pipeline=NAME, epochs=...,
               max_class_drift=..., max_feature_drift=...)
      outputs["best_hyperparameters"]   HyperParameters: TFX's best_hyperparameters.txt (what the Trainer reads)
      outputs["tuner_results"]          TunerResults: TFX's tuner_results.json, search.json and tuning.json

TFX's Tuner spec, so the Trainer takes best_hyperparameters as it takes any Tuner's; `vertex` (custom_config
entries of TFX's Vertex Tuner extension) and `parallel_trials` run the search as a Vertex AI Training job.
"""

from typing import Any, Dict, Optional, Union

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.dsl.input_resolution.strategies.latest_artifact_strategy import LatestArtifactStrategy
from tfx.orchestration import data_types
from tfx.proto import trainer_pb2, tuner_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.utils import json_utils

from components.tuner import Search, executor
from settings import declared, kind
from storage.artifact_types import ImageIngestionReport


class LatestSearch(LatestArtifactStrategy):
    """The latest tuner_results of a search, not of a run that reused one, or none (TFX's strategy fails on
    none). Every rerun that reuses a search then has the same input: its Tuner, and the Trainer after it, are
    taken from the cache. Vertex's compiler knows TFX's strategies only: there the latest of any run."""

    def resolve_artifacts(self, store, input_dict):
        searched = {
            key: [a for a in artifacts if a.get_int_custom_property(executor.SEARCHED) == 1]
            for key, artifacts in input_dict.items()
        }
        return super().resolve_artifacts(store, searched) or {key: [] for key in input_dict}


class ImageTunerSpec(standard_component_specs.TunerSpec):
    PARAMETERS = {
        **standard_component_specs.TunerSpec.PARAMETERS,
        # each declared search setting (Search: tune_trials, tune_mode), by its name
        **{f.name: ExecutionParameter(type=kind(f)) for f in declared(Search)},
        "epochs": ExecutionParameter(type=int, optional=True),  # a compiled job's runtime parameter, as the Trainer's
        executor.PIPELINE: ExecutionParameter(type=str),
        **{limit: ExecutionParameter(type=float) for limit in executor.LIMITS},
    }
    INPUTS = {
        **standard_component_specs.TunerSpec.INPUTS,
        "ingestion_report": ChannelParameter(type=ImageIngestionReport),
        "previous": ChannelParameter(type=standard_artifacts.TunerResults, optional=True),  # the last search's
    }


class ImageTuner(base_component.BaseComponent):
    SPEC_CLASS = ImageTunerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        examples: types.BaseChannel,
        transform_graph: types.BaseChannel,
        ingestion_report: types.BaseChannel,
        hparams: Dict[str, Any],
        previous: Optional[types.BaseChannel] = None,
        vertex: Optional[Dict[str, Any]] = None,
        parallel_trials: int = 1,
        **parameters: Union[int, float, str, data_types.RuntimeParameter, None],
    ):
        """`parameters`: the spec's own by name: the declared search settings (tune_trials may be a runtime
        parameter), epochs, pipeline, the drift limits (executor.LIMITS)."""
        super().__init__(
            spec=ImageTunerSpec(
                examples=examples,
                transform_graph=transform_graph,
                ingestion_report=ingestion_report,
                previous=previous,
                tuner_fn="trainer.search.tuner_fn",
                train_args=trainer_pb2.TrainArgs(splits=["train"]),
                eval_args=trainer_pb2.EvalArgs(splits=["eval"]),
                tune_args=tuner_pb2.TuneArgs(num_parallel_trials=parallel_trials) if vertex else None,
                custom_config=json_utils.dumps({**hparams, **(vertex or {})}),
                **parameters,
                best_hyperparameters=types.Channel(type=standard_artifacts.HyperParameters),
                tuner_results=types.Channel(type=standard_artifacts.TunerResults),
            )
        )
