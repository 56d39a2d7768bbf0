"""What the stages' summary readers share (each stage's summary.py: the facts the run summary and the report take
from its outputs). `c` is a component of runs/run_summary.py's summary: its state, its inputs' and outputs' folders
(as they are now) and their properties. Plain Python: no TFX, no TensorFlow.
"""

import json
import os
from typing import Any, Dict, List, Optional


def first(folders: Dict[str, List[str]], key: str) -> Optional[str]:
    """The first folder of an input or output, or None."""
    uris = folders.get(key) or []
    return uris[0] if uris else None


def json_output(c: Dict[str, Any], output: str, name: str, **files: str) -> Dict[str, Any]:
    """The JSON file `name` of a component's output, with the paths of `files` (key: file name) beside
    it; {} when the output or the file is missing."""
    folder = first(c["outputs"], output)
    path = folder and os.path.join(folder, name)
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {**json.load(f), **{key: os.path.join(folder, file) for key, file in files.items()}}


def megabytes(uri: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(uri) for f in fs) / 2**20
