"""Transform's summary, read back for the run summary and the report: the size of its records."""

from typing import Any, Dict

from components.summary_reading import first, megabytes


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    examples = first(c["outputs"], "transformed_examples")
    return {"transformed_megabytes": round(megabytes(examples), 2)} if examples else {}
