"""The Evaluator: TFX's (tuned and made class-aware in executor.py), with the settings a compiled job's runs can
change as parameters of its own (see components/trainer/component.py for why):

    ImageEvaluator(..., settings={"accuracy_threshold": RuntimeParameter(...), "min_class_recall": ...})
      -> eval_config's threshold, the class gate, views.json's threshold, the explanations
"""

from typing import Any, Dict, List, Optional

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.utils import json_utils

from components.evaluator import Blessing
from components.evaluator.executor import Executor
from components.evaluator.on_features import FEATURES_KEY
from settings import declared, kind

# Its parameters: the settings declared in components/evaluator/__init__.py (Blessing), by name.
EVALUATOR_SETTINGS = {f.name: kind(f) for f in declared(Blessing)}


class ImageEvaluatorSpec(standard_component_specs.EvaluatorSpec):
    # the features step's output: TFMA scores the models' heads on it (components/evaluator/on_features.py)
    INPUTS = {
        **standard_component_specs.EvaluatorSpec.INPUTS,
        FEATURES_KEY: ChannelParameter(type=standard_artifacts.Examples, optional=True),
    }
    PARAMETERS = {
        **standard_component_specs.EvaluatorSpec.PARAMETERS,
        **{k: ExecutionParameter(type=t, optional=True) for k, t in EVALUATOR_SETTINGS.items()},
    }


class ImageEvaluator(base_beam_component.BaseBeamComponent):
    """TFX's Evaluator (tuned and made class-aware in executor.py) with `accuracy_threshold`."""

    SPEC_CLASS = ImageEvaluatorSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(
        self,
        examples: types.BaseChannel,
        model: types.BaseChannel,
        eval_config,
        example_splits: List[str],
        settings: Dict[str, Any],
        baseline_model: Optional[types.BaseChannel] = None,
        features: Optional[types.BaseChannel] = None,
    ):
        super().__init__(
            spec=ImageEvaluatorSpec(
                examples=examples,
                features=features,
                model=model,
                baseline_model=baseline_model,
                eval_config=eval_config,
                example_splits=json_utils.dumps(example_splits),
                fairness_indicator_thresholds=json_utils.dumps(None),
                **settings,
                evaluation=types.Channel(type=standard_artifacts.ModelEvaluation),
                blessing=types.Channel(type=standard_artifacts.ModelBlessing),
            )
        )
