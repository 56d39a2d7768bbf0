"""The Trainer: TFX's (run_fn: trainer/task.py), with the settings a compiled job can change as parameters of its own.

KubeflowV2DagRunner turns a RuntimeParameter into a pipeline parameter (`tfx run create --runtime_parameter
epochs=20`, `imagepipe submit --param epochs=20`) only where it is a component's whole parameter. The
Trainer's settings live inside its custom_config (one JSON string) and the accuracy threshold inside the
Evaluator's eval_config, so both take them as parameters of their own (the Evaluator: components/evaluator/
component.py), and their executors put them in place before TFX's run:

    ImageTrainer(..., epochs=RuntimeParameter("epochs", int), learning_rate=...)   -> custom_config
    ImageEvaluator(..., accuracy_threshold=RuntimeParameter(...))                  -> eval_config's threshold

Locally the values are plain numbers (the same as in custom_config and eval_config).
"""

from typing import Any, Dict, Optional

from tfx import types
from tfx.components.trainer import executor as trainer_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.extensions.google_cloud_ai_platform.trainer import executor as vertex_trainer_executor
from tfx.proto import trainer_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ExecutionParameter
from tfx.utils import json_utils

from components.freed_memory import give_back_freed_memory
from settings import declared, kind
from trainer.hparams import HParams

# The training settings a compiled job's runs can change (declared `runtime` in trainer/hparams.py): parameters of
# the Trainer's own, written into its custom_config when given.
TRAINER_SETTINGS = {f.name: kind(f) for f in declared(HParams) if f.metadata["runtime"]}


def with_settings(exec_properties: Dict[str, Any]) -> Dict[str, Any]:
    """exec_properties with the Trainer's own settings written into its custom_config."""
    settings = {k: exec_properties[k] for k in TRAINER_SETTINGS if exec_properties.get(k) is not None}
    if not settings:
        return exec_properties
    key = standard_component_specs.CUSTOM_CONFIG_KEY
    config = json_utils.loads(exec_properties.get(key) or "null") or {}
    return {**exec_properties, key: json_utils.dumps({**config, **settings})}


RUN_FN = "trainer.task.run_fn"  # the model code's entry point (trainer/task.py)


class TrainerExecutor(trainer_executor.GenericExecutor):
    def Do(self, input_dict, output_dict, exec_properties):
        try:
            return super().Do(input_dict, output_dict, with_settings(exec_properties))
        finally:
            give_back_freed_memory()


class VertexTrainerExecutor(vertex_trainer_executor.GenericExecutor):
    """Starts the Vertex AI Training job with the settings in custom_config (the job's Trainer reads it)."""

    def Do(self, input_dict, output_dict, exec_properties):
        return super().Do(input_dict, output_dict, with_settings(exec_properties))


class ImageTrainerSpec(standard_component_specs.TrainerSpec):
    PARAMETERS = {
        **standard_component_specs.TrainerSpec.PARAMETERS,
        **{k: ExecutionParameter(type=t, optional=True) for k, t in TRAINER_SETTINGS.items()},
    }


class ImageTrainer(base_component.BaseComponent):
    """TFX's Trainer (run_fn, Transform's graph, the Tuner's hyperparameters) with `epochs` and `learning_rate`."""

    SPEC_CLASS = ImageTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TrainerExecutor)

    def __init__(
        self,
        examples: types.BaseChannel,
        transform_graph: types.BaseChannel,
        schema: types.BaseChannel,
        custom_config: Dict[str, Any],
        settings: Dict[str, Any],
        base_model: Optional[types.BaseChannel] = None,
        hyperparameters: Optional[types.BaseChannel] = None,
        vertex: bool = False,
    ):
        super().__init__(
            spec=ImageTrainerSpec(
                examples=examples,
                transform_graph=transform_graph,
                schema=schema,
                base_model=base_model,
                hyperparameters=hyperparameters,
                train_args=trainer_pb2.TrainArgs(splits=["train"]),
                eval_args=trainer_pb2.EvalArgs(splits=["eval"]),
                run_fn=RUN_FN,
                custom_config=json_utils.dumps(custom_config),
                **settings,
                model=types.Channel(type=standard_artifacts.Model),
                model_run=types.Channel(type=standard_artifacts.ModelRun),
            )
        )
        if vertex:  # the Trainer as a Vertex AI Training job (custom_config has the extension's settings)
            self.executor_spec = executor_spec.ExecutorClassSpec(VertexTrainerExecutor)
