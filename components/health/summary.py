"""DataHealth's and DataHealthGate's summaries, read back for the run summary and the report."""

from typing import Any, Dict

from components.health import HEALTH_FILE, LABEL_ISSUES_FILE, OUTLIERS_FILE
from components.summary_reading import json_output


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    return json_output(c, "health", HEALTH_FILE, label_issues_csv=LABEL_ISSUES_FILE, outliers_csv=OUTLIERS_FILE)


def read_gate(c: Dict[str, Any]) -> Dict[str, Any]:
    result = c["output_properties"].get("result")
    return {"passed": bool(result[0].get("passed"))} if result else {}
