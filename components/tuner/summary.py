"""The Tuner's summary, read back for the run summary and the report: searched or reused, and why."""

from typing import Any, Dict

from components.summary_reading import json_output
from components.tuner import DECISION_FILE


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    return json_output(c, "tuner_results", DECISION_FILE)
