"""The Pusher's summary, read back for the run summary and the report: pushed or not, and where."""

from typing import Any, Dict

from components.summary_reading import first


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    if not first(c["outputs"], "pushed_model"):
        return {}
    pushed = (c["output_properties"].get("pushed_model") or [{}])[0]
    return {"pushed": bool(pushed.get("pushed")), "destination": pushed.get("pushed_destination", "")}
