"""DataHealthGate: stops the run when DataHealth's findings are over their limits (or warns).

A separate step, as ExampleValidator and DataValidationGate are: a failed execution's outputs are
removed, and the findings (label_issues.csv, outliers.csv) must stay for a person to review.
The Trainer runs after it: `trainer.add_upstream_node(health_gate)`.
"""

import json
import os

from absl import logging
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.utils import io_utils

from components.health import HEALTH_FILE, checks
from storage.artifact_types import DataHealthReport, DataValidationResult


class DataHealthError(RuntimeError):
    """Data health is over a limit and the gate is set to stop the run; one line naming each option."""


@component
def DataHealthGate(
    health: InputArtifact[DataHealthReport],
    result: OutputArtifact[DataValidationResult],
    fail_on_problems: Parameter[bool] = True,
) -> None:
    found = json.loads(io_utils.read_string_file(os.path.join(health.uri, HEALTH_FILE)))["problems"]
    result.set_int_custom_property("passed", int(not found))
    if not found:
        return
    if fail_on_problems:
        raise DataHealthError(checks.describe(found))
    logging.warning("DataHealthGate (warn only): %s", checks.describe(found))
