"""The validation stages' summaries, read back for the run summary and the report (no TFX at import): the gate's
verdict and drift, ExampleValidator's anomalies, the schema's file."""

import json
import os
from typing import Any, Dict

from components import drift as drift_lib
from components.summary_reading import first
from components.validation import GATE_DRIFT_FILE, GATE_RESULT_FILE


def read_gate(c: Dict[str, Any]) -> Dict[str, Any]:
    result = first(c["outputs"], "result")
    if result and os.path.exists(os.path.join(result, GATE_RESULT_FILE)):
        with open(os.path.join(result, GATE_RESULT_FILE)) as f:
            anomalies = json.load(f)
        drift_path = os.path.join(result, GATE_DRIFT_FILE)
        drift = {"skipped": "not checked"}
        if os.path.exists(drift_path):
            with open(drift_path) as f:
                drift = json.load(f)
        drifted = [check for check in drift.get("checks", []) if check["drifted"]]
        return {"anomalies": anomalies, "drift": drift, "drifted": drifted, "passed": not anomalies and not drifted}
    if c["state"] == "FAILED" and first(c["inputs"], "examples"):
        # A failed execution's outputs are removed: the drift is computed again from its inputs, for the report.
        return {"drift": _gate_drift(c), "stopped": True}
    return {}


def _gate_drift(c: Dict[str, Any]) -> Dict[str, Any]:
    """The gate's drift result, from its inputs and parameters (its outputs are gone when it failed)."""
    # gate.py imports TFX (~6 s): the run summary imports this module, and loads no TFX
    from components.validation.gate import read_profile

    given = {k: float(c["properties"][k]) for k in drift_lib.Thresholds.__dataclass_fields__ if k in c["properties"]}
    limits = drift_lib.Thresholds(**given)
    blessing = first(c["inputs"], "baseline_blessing")
    return drift_lib.check(
        read_profile(blessing) if blessing else None,
        read_profile(first(c["inputs"], "examples")),
        limits,
        has_baseline=blessing is not None,
    )


def read_example_validator(c: Dict[str, Any]) -> Dict[str, Any]:
    # TFX: as in _gate_drift
    from components.validation.gate import read_anomalies

    anomalies = first(c["outputs"], "anomalies")
    return {"anomalies": read_anomalies(anomalies)} if anomalies else {}


def read_schema(c: Dict[str, Any]) -> Dict[str, Any]:
    schema = first(c["outputs"], "schema")
    return {"schema": os.path.join(schema, "schema.pbtxt")} if schema else {}
