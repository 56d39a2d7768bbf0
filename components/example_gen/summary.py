"""ImageExampleGen's summary, read back for the run summary and the report (no TFX)."""

import json
import os
from typing import Any, Dict

from components.example_gen import FAILED_DIR, NEAR_DUPLICATES_FILE, QUARANTINE_FILE, SUMMARY_FILE
from components.summary_reading import json_output


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    return json_output(
        c, "report", SUMMARY_FILE, quarantine_csv=QUARANTINE_FILE, near_duplicates_csv=NEAR_DUPLICATES_FILE
    )


def read_failed(c: Dict[str, Any], metadata_path: str) -> Dict[str, Any]:
    """What a failed ingestion found (its outputs are removed; the executor keeps the summary and the quarantine
    list in <pipeline root>/<component>/failed/<execution id>/), or {}."""
    name_dir = os.path.dirname(metadata_path)
    folder = os.path.join(
        os.path.dirname(os.path.dirname(name_dir)),
        "pipelines",
        os.path.basename(name_dir),
        c["component"],
        FAILED_DIR,
        str(c["execution_id"]),
    )
    path = os.path.join(folder, SUMMARY_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        # no near_duplicates.csv: a failed ingestion keeps its quarantine list only
        return {
            **json.load(f),
            "quarantine_csv": os.path.join(folder, QUARANTINE_FILE),
            "near_duplicates_csv": None,
            "failed": True,
        }
