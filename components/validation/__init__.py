"""Validation: StatisticsGen (statistics.py: its options and executor for images), SchemaGen or ImportSchemaGen and
ExampleValidator (TFX's), then DataValidationGate (gate.py): stops the run on anomalies or on drift from the last
blessed model's data (components/drift.py)."""

import dataclasses

from settings import setting

GATE_MODES = ("fail", "warn")


@dataclasses.dataclass(frozen=True)
class Gate:
    """What the gates do with what they find (this one and data health's, components/health/gate.py)."""

    gate: str = setting("fail", "on anomalies or drift: fail (stop the run) or warn; default {default}", GATE_MODES)


# DataValidationGate's `result` (gate.py), read back by the run summary and the report
GATE_RESULT_FILE = "anomalies.json"  # the anomalies the gate judged
GATE_DRIFT_FILE = "drift.json"  # the drift checks against the last blessed model's data
