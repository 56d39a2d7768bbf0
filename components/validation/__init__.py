"""Validation: StatisticsGen (statistics.py: its options and executor for images), SchemaGen or ImportSchemaGen and
ExampleValidator (TFX's), then DataValidationGate (gate.py): stops the run on anomalies or on drift from the last
blessed model's data (components/drift.py)."""
