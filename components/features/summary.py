"""BackboneFeatures' summary, read back for the run summary and the report: images, features reused and computed."""

from typing import Any, Dict

from components.features import SUMMARY_FILE
from components.summary_reading import json_output


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    return json_output(c, "features", SUMMARY_FILE)
