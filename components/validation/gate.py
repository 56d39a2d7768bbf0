"""DataValidationGate: stops the run when ExampleValidator found anomalies, or the data drifted.

ExampleValidator only records anomalies; nothing downstream reads them, so bad
data trains a model anyway (tensorflow/tfx-addons#153). This component reads
every split's anomalies, and compares the new data's profile with the one kept
with the latest blessed model's blessing (components/drift.py), then fails its
execution with the list, so the orchestrator runs nothing after it. With
fail_on_anomalies=False it records and logs them and lets the run go on.

Downstream components must run after it: `transform.add_upstream_node(gate)`.
"""

import json
import os
from typing import Dict, List, Optional

from absl import logging
from tensorflow_metadata.proto.v0 import anomalies_pb2
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.dsl.io import fileio
from tfx.types import standard_artifacts
from tfx.utils import io_utils

from components import drift
from components.example_gen import PROFILE_FILE
from components.validation import GATE_DRIFT_FILE, GATE_RESULT_FILE
from storage.artifact_types import DataValidationResult
from storage.relocation import locate

ANOMALIES_FILE = "SchemaDiff.pb"  # what ExampleValidator writes per split


class DataValidationError(RuntimeError):
    """The data has anomalies and the gate is set to stop the run."""


def read_anomalies(anomalies_uri: str) -> List[Dict[str, str]]:
    """Every anomaly of every split under an ExampleAnomalies URI, as plain dicts."""
    found = []
    for split_dir in sorted(fileio.glob(os.path.join(anomalies_uri, "Split-*"))):
        split = os.path.basename(split_dir.rstrip("/"))[len("Split-") :]
        path = os.path.join(split_dir, ANOMALIES_FILE)
        if not fileio.exists(path):
            continue
        proto = anomalies_pb2.Anomalies.FromString(io_utils.read_bytes_file(path))
        infos = sorted(proto.anomaly_info.items())
        if proto.HasField("dataset_anomaly_info"):
            infos.append(("(dataset)", proto.dataset_anomaly_info))
        for feature, info in infos:
            found.append(
                {
                    "split": split,
                    "feature": feature,
                    "short": info.short_description,
                    "description": info.description,
                    "types": [anomalies_pb2.AnomalyInfo.Type.Name(r.type) for r in info.reason],
                }
            )
    return found


def describe(found: List[Dict[str, str]], drifted: List[Dict] = ()) -> str:
    """A first line that names every problem (feature, and distance for drift), then one line of detail each."""
    short = [f"[{a['split']}] {a['feature']}: {a['short']}" for a in found] + [drift.short_check(c) for c in drifted]
    shown = "; ".join(short[:4]) + (f"; and {len(short) - 4} more" if len(short) > 4 else "")
    fixes = (
        ["fix the data"]
        + (["update the schema (schemas/README.md)"] if found else [])
        + ([f"raise {' / '.join(sorted({c['option'] for c in drifted}))}"] if drifted else [])
    )
    lines = [
        f"data validation found {len(short)} problem{'s' if len(short) > 1 else ''}: {shown}; "
        f"{', or '.join(fixes)}, or run with --gate warn"
    ]
    for a in found:
        lines.append(f"  [{a['split']}] {a['feature']}: {a['short']} - {a['description']}")
    for check in drifted:
        lines.append(f"  [drift] {drift.describe_check(check)}")
    return "\n".join(lines)


def read_profile(uri: str) -> Optional[Dict]:
    path = os.path.join(uri, PROFILE_FILE)
    return json.loads(io_utils.read_string_file(path)) if fileio.exists(path) else None


@component
def DataValidationGate(
    anomalies: InputArtifact[standard_artifacts.ExampleAnomalies],
    examples: InputArtifact[standard_artifacts.Examples],
    result: OutputArtifact[DataValidationResult],
    baseline_blessing: InputArtifact[standard_artifacts.ModelBlessing] = None,
    fail_on_anomalies: Parameter[bool] = True,
    drift_thresholds: Parameter[str] = "{}",
) -> None:
    """`drift_thresholds`: the declared drift thresholds (drift.Thresholds) as JSON, each left out at its default:
    a new threshold reaches the gate from its declaration."""
    found = read_anomalies(anomalies.uri)
    limits = drift.Thresholds(**json.loads(drift_thresholds or "{}"))
    # The blessing's folder where the root now is; gone, the run stops here (storage/relocation.py),
    # before training a model that could not be compared either.
    reference = read_profile(locate(baseline_blessing.uri, examples.uri, "blessing")) if baseline_blessing else None
    drift_result = drift.check(reference, read_profile(examples.uri), limits, has_baseline=bool(baseline_blessing))
    drifted = [c for c in drift_result.get("checks", []) if c["drifted"]]
    io_utils.write_string_file(os.path.join(result.uri, GATE_RESULT_FILE), json.dumps(found, indent=1))
    io_utils.write_string_file(os.path.join(result.uri, GATE_DRIFT_FILE), json.dumps(drift_result, indent=1))
    result.set_int_custom_property("passed", int(not found and not drifted))
    result.set_int_custom_property("anomalies", len(found))
    result.set_int_custom_property("drifted", len(drifted))
    classes = drift.describe_classes(drift_result)
    if classes:
        logging.warning("DataValidationGate: %s", classes)
    if not found and not drifted:
        logging.info("DataValidationGate: no anomalies, no drift (%s)", drift_result.get("skipped", "compared"))
        return
    if fail_on_anomalies:
        raise DataValidationError(describe(found, drifted))
    logging.warning("DataValidationGate (warn only): %s", describe(found, drifted))
