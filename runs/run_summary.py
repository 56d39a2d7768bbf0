"""What each component of a run did, read back from ML Metadata (run_store.py) and the artifacts.

`summarize(metadata_path)` returns plain dicts (tests assert on them): per component its state,
time, artifacts and `details`, the facts its reader in DETAILS takes from its outputs (ingestion
counts, gate verdict, training log, TFMA metrics, ...). run_text.py and report.py present them.
"""

import glob
import os
from typing import Any, Callable, Dict, List, Optional

from ml_metadata.proto import metadata_store_pb2

from components.evaluator import results as evaluation_results
from components.evaluator import summary as evaluator_summary
from components.example_gen import summary as example_gen_summary
from components.features import summary as features_summary
from components.health import summary as health_summary
from components.model_card import summary as model_card_summary
from components.pusher import summary as pusher_summary
from components.trainer import summary as trainer_summary
from components.transform import summary as transform_summary
from components.tuner import summary as tuner_summary
from components.validation import summary as validation_summary
from runs import run_lock, run_store
from storage.files import is_remote
from storage.relocation import relocate


def artifact_path(uri: str, metadata_path: str) -> str:
    """An artifact's folder as recorded, or where it is now when the root was moved or copied (ML Metadata
    keeps the paths of the root the run wrote to: <root>/metadata/<name>/metadata.db and
    <root>/pipelines/<name>/... move together)."""
    name_dir = os.path.dirname(metadata_path)
    root, name = os.path.dirname(os.path.dirname(name_dir)), os.path.basename(name_dir)
    for folder in ("pipelines", "serving"):  # artifacts, and the Pusher's destinations
        found = relocate(uri, os.path.join(root, folder, name))
        if found != uri:
            return found
    return uri


def list_runs(metadata_path: str) -> List[Dict[str, Any]]:
    """Every run, newest first: id, start, duration, status, component states, accuracy, blessing."""
    store = run_store.open_store(metadata_path)
    in_progress = run_lock.held(metadata_path)
    out = []
    for run in run_store.runs(store):
        executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
        components = [
            {
                "component": run_store.node_name(store, e),
                "state": run_store.state_name(e),
                "error": run_store.execution_error(e),
            }
            for e in executions
        ]
        evaluation = next((e for e, c in zip(executions, components) if c["component"] == "Evaluator"), None)
        accuracy = blessed = None
        if evaluation is not None:
            details = _evaluator_details(store, evaluation, metadata_path)
            accuracy, blessed = details.get("accuracy"), details.get("blessed")
        failed = next((c for c in components if c["state"] == "FAILED"), None)
        # Only the newest run can still be going: an older unfinished one was interrupted.
        status = run_store.run_status(components, in_progress and not out)
        ends = [e.last_update_time_since_epoch for e in executions] or [run.create_time_since_epoch]
        if status == "interrupted":
            # A killed process records no end: its unfinished components stopped, at the latest, when they
            # last wrote an output file (the Trainer writes its logs every epoch).
            for c, e in zip(components, executions):
                if c["state"] in ("running", "new"):
                    c["state"] = "interrupted"
                    ends.append(_last_write_ms(c["component"], e, metadata_path))
        out.append(
            {
                "run_id": run.name,
                "started_ms": run.create_time_since_epoch,
                "seconds": round((max(ends) - run.create_time_since_epoch) / 1000, 1),
                "status": status,
                "components": components,
                "failed_component": failed["component"] if failed else None,
                "error": failed["error"] if failed else "",
                "accuracy": accuracy,
                "blessed": blessed,
            }
        )
    return out


def _last_write_ms(node: str, execution, metadata_path: str) -> int:
    """When an unfinished execution last wrote into its outputs (milliseconds since the epoch; 0 if never).
    It has no output recorded yet: LocalDagRunner writes them to <pipeline root>/<node>/<output>/<id>."""
    name_dir = os.path.dirname(metadata_path)
    pattern = os.path.join(
        os.path.dirname(os.path.dirname(name_dir)),
        "pipelines",
        os.path.basename(name_dir),
        glob.escape(node),
        "*",
        str(execution.id),
    )
    latest = 0.0
    for folder in glob.glob(pattern):
        for path, _, names in os.walk(folder):
            latest = max([latest, os.path.getmtime(path)] + [os.path.getmtime(os.path.join(path, n)) for n in names])
    return int(latest * 1000)


def _evaluator_details(store, execution, metadata_path: str) -> Dict[str, Any]:
    events = [e for e in store.get_events_by_execution_ids([execution.id]) if e.type == metadata_store_pb2.Event.OUTPUT]
    found: Dict[str, Any] = {}
    for event, artifact in zip(events, store.get_artifacts_by_id([e.artifact_id for e in events])):
        key = event.path.steps[0].key if event.path.steps else ""
        if key == "blessing":
            found["blessed"] = bool(run_store.scalars(artifact.custom_properties).get("blessed"))
        elif key == "evaluation":
            try:
                found["accuracy"] = evaluation_results.metrics(artifact_path(artifact.uri, metadata_path))["accuracy"]
            except Exception:  # noqa: BLE001 - a deleted or unreadable evaluation: no figure
                found["accuracy"] = None
    return found


def summarize(metadata_path: str, run_id: Optional[str] = None) -> Dict[str, Any]:
    """The newest run (or `run_id`): its id and, per executed component, state, seconds, outputs."""
    store = run_store.open_store(metadata_path)
    recorded = run_store.runs(store)
    run = run_store.find_run(recorded, metadata_path, run_id)
    components = [
        _component(store, execution, metadata_path)
        for execution in sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
    ]
    _add_details(components, metadata_path)
    _add_per_class_metrics(components)
    status = run_store.run_status(components, recorded[0].id == run.id and run_lock.held(metadata_path))
    return {
        "run_id": run.name,
        "started_ms": run.create_time_since_epoch,
        "status": status,
        "metadata_path": metadata_path,
        "components": components,
    }


def _component(store, execution, metadata_path: str) -> Dict[str, Any]:
    """One executed component as recorded: state, times, its input and output artifacts' paths, properties."""
    node = run_store.node_name(store, execution)
    outputs: Dict[str, List[str]] = {}
    properties: Dict[str, List[Dict[str, Any]]] = {}
    inputs: Dict[str, List[str]] = {}
    events = store.get_events_by_execution_ids([execution.id])
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in events])}
    for event in events:
        key = event.path.steps[0].key if event.path.steps else "output"
        artifact = artifacts[event.artifact_id]
        uri = artifact_path(artifact.uri, metadata_path)
        if event.type == metadata_store_pb2.Event.INPUT:
            inputs.setdefault(key, []).append(uri)
        elif event.type == metadata_store_pb2.Event.OUTPUT:
            outputs.setdefault(key, []).append(uri)
            properties.setdefault(key, []).append(run_store.scalars(artifact.custom_properties))
    return {
        "component": node,
        "execution_id": execution.id,
        "state": run_store.state_name(execution),
        "started_ms": execution.create_time_since_epoch,
        "seconds": round((execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000, 1),
        "inputs": inputs,
        "outputs": outputs,
        "output_properties": properties,
        "properties": run_store.scalars(execution.custom_properties),
        "error": run_store.execution_error(execution),
    }


def _add_details(components: List[Dict[str, Any]], metadata_path: str) -> None:
    """Each component's "missing" outputs and, when none are, its "details" (each stage's summary reader)."""
    for c in components:
        # Outputs deleted since (a pipelines/ folder removed by hand): said so, never read.
        c["missing"] = sorted(
            u
            for uris in c["outputs"].values()
            for u in uris
            if c["state"] in ("ran", "cached") and not is_remote(u) and not os.path.exists(u)
        )
        c["details"] = {} if c["missing"] else _details(c)
        if not c["details"] and c["state"] == "FAILED" and component_kind(c["component"]) == "ImageExampleGen":
            c["details"] = example_gen_summary.read_failed(c, metadata_path)
        if c["details"].get("destination"):  # the Pusher's folder, recorded like an artifact's
            c["details"]["destination"] = artifact_path(c["details"]["destination"], metadata_path)


def _add_per_class_metrics(components: List[Dict[str, Any]]) -> None:
    trainer = next((c["details"] for c in components if c["component"] == "Trainer"), {})
    for c in components:
        # Evaluations made before TFMA computed each class's figures: from the confusion matrix.
        if (
            c["component"] == "Evaluator"
            and c["details"]
            and not c["details"].get("per_class")
            and trainer.get("class_names")
        ):
            c["details"]["per_class"] = per_class_metrics(c["details"]["confusion"], trainer["class_names"])


# The reader of each component's details, by the component's id (or the start of it): each stage's summary.py.
DETAILS: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "ImageExampleGen": example_gen_summary.read,
    "DataValidationGate": validation_summary.read_gate,
    "Transform": transform_summary.read,
    "BackboneFeatures": features_summary.read,
    "DataHealthGate": health_summary.read_gate,
    "DataHealth": health_summary.read,  # after DataHealthGate: a component's kind is the first key its id starts with
    "Tuner": tuner_summary.read,
    "Trainer": trainer_summary.read,
    "Evaluator": evaluator_summary.read,
    "ModelCard": model_card_summary.read,
    "Pusher": pusher_summary.read,
    "ExampleValidator": validation_summary.read_example_validator,
    "SchemaGen": validation_summary.read_schema,
    "ImportSchemaGen": validation_summary.read_schema,
}


def component_kind(name: str) -> Optional[str]:
    """The DETAILS key a component id starts with ('ImageExampleGen', 'Trainer', ...), if any."""
    return next((kind for kind in DETAILS if name.startswith(kind)), None)


def _details(c: Dict[str, Any]) -> Dict[str, Any]:
    kind = component_kind(c["component"])
    return DETAILS[kind](c) if kind else {}


def per_class_metrics(confusion: List[List[int]], class_names: List[str]) -> Dict[str, Dict[str, float]]:
    """Precision, recall and support per class, from the confusion matrix."""
    out = {}
    for class_id, name in enumerate(class_names):
        true_positive = sum(n for a, p, n in confusion if a == p == class_id)
        actual = sum(n for a, _, n in confusion if a == class_id)
        predicted = sum(n for _, p, n in confusion if p == class_id)
        out[name] = {
            "precision": true_positive / predicted if predicted else 0.0,
            "recall": true_positive / actual if actual else 0.0,
            "support": actual,
        }
    return out
