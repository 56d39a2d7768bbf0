"""Validation: StatisticsGen (statistics.py: its options and executor for images), SchemaGen or ImportSchemaGen and
ExampleValidator (TFX's), then DataValidationGate (gate.py): stops the run on anomalies or on drift from the last
blessed model's data (components/drift.py)."""

# DataValidationGate's `result` (gate.py), read back by the run summary and the report
GATE_RESULT_FILE = "anomalies.json"  # the anomalies the gate judged
GATE_DRIFT_FILE = "drift.json"  # the drift checks against the last blessed model's data
