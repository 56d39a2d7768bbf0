"""What each component of a run did, read back from ML Metadata (run_store.py) and the artifacts.

`summarize(metadata_path)` returns plain dicts (tests assert on them): per component its state,
time, artifacts and `details`, the facts its reader in DETAILS takes from its outputs (ingestion
counts, gate verdict, training log, TFMA metrics, ...). run_text.py and report.py present them.
"""

import glob
import json
import os
from typing import Any, Callable, Dict, List, Optional

from ml_metadata.proto import metadata_store_pb2

from components import drift as drift_lib
from components.evaluator import explanations as eval_explanations
from components.evaluator import results as evaluation_results
from components.example_gen import FAILED_DIR, NEAR_DUPLICATES_FILE, QUARANTINE_FILE, SUMMARY_FILE
from components.features import SUMMARY_FILE as FEATURES_SUMMARY
from components.health import HEALTH_FILE, LABEL_ISSUES_FILE, OUTLIERS_FILE
from components.model_card import CARD_HTML, CARD_JSON, CARD_MD
from components.tuner import DECISION_FILE as TUNING_FILE
from components.validation import GATE_DRIFT_FILE, GATE_RESULT_FILE
from runs import run_lock, run_store
from storage.files import is_remote
from storage.relocation import relocate
from trainer.artifact_files import TRAINING_LOG
from trainer.epochs import kept_epoch, monitor_of


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
    components = []
    for execution in sorted(store.get_executions_by_context(run.id), key=lambda e: e.id):
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
        components.append(
            {
                "component": node,
                "execution_id": execution.id,
                "state": run_store.state_name(execution),
                "started_ms": execution.create_time_since_epoch,
                "seconds": round(
                    (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000, 1
                ),
                "inputs": inputs,
                "outputs": outputs,
                "output_properties": properties,
                "properties": run_store.scalars(execution.custom_properties),
                "error": run_store.execution_error(execution),
            }
        )
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
            c["details"] = _failed_ingestion(c, metadata_path)
        if c["details"].get("destination"):  # the Pusher's folder, recorded like an artifact's
            c["details"]["destination"] = artifact_path(c["details"]["destination"], metadata_path)
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
    status = run_store.run_status(components, recorded[0].id == run.id and run_lock.held(metadata_path))
    return {
        "run_id": run.name,
        "started_ms": run.create_time_since_epoch,
        "status": status,
        "metadata_path": metadata_path,
        "components": components,
    }


def _first(outputs: Dict[str, List[str]], key: str) -> Optional[str]:
    uris = outputs.get(key) or []
    return uris[0] if uris else None


def _json_output(c: Dict[str, Any], output: str, name: str, **files: str) -> Dict[str, Any]:
    """The JSON file `name` of a component's output, with the paths of `files` (key: file name) beside
    it; {} when the output or the file is missing."""
    folder = _first(c["outputs"], output)
    path = folder and os.path.join(folder, name)
    if not path or not os.path.exists(path):
        return {}
    return {**json.load(open(path)), **{key: os.path.join(folder, file) for key, file in files.items()}}


def _ingestion(c: Dict[str, Any]) -> Dict[str, Any]:
    return _json_output(
        c, "report", SUMMARY_FILE, quarantine_csv=QUARANTINE_FILE, near_duplicates_csv=NEAR_DUPLICATES_FILE
    )


def _failed_ingestion(c: Dict[str, Any], metadata_path: str) -> Dict[str, Any]:
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


def _gate(c: Dict[str, Any]) -> Dict[str, Any]:
    result = _first(c["outputs"], "result")
    if result and os.path.exists(os.path.join(result, GATE_RESULT_FILE)):
        anomalies = json.load(open(os.path.join(result, GATE_RESULT_FILE)))
        drift_path = os.path.join(result, GATE_DRIFT_FILE)
        drift = json.load(open(drift_path)) if os.path.exists(drift_path) else {"skipped": "not checked"}
        drifted = [check for check in drift.get("checks", []) if check["drifted"]]
        return {"anomalies": anomalies, "drift": drift, "drifted": drifted, "passed": not anomalies and not drifted}
    if c["state"] == "FAILED" and _first(c["inputs"], "examples"):
        # A failed execution's outputs are removed: the drift is computed again from its inputs, for the report.
        return {"drift": _gate_drift(c), "stopped": True}
    return {}


def _transform(c: Dict[str, Any]) -> Dict[str, Any]:
    examples = _first(c["outputs"], "transformed_examples")
    return {"transformed_megabytes": round(_megabytes(examples), 2)} if examples else {}


def _features(c: Dict[str, Any]) -> Dict[str, Any]:
    return _json_output(c, "features", FEATURES_SUMMARY)


def _health(c: Dict[str, Any]) -> Dict[str, Any]:
    return _json_output(c, "health", HEALTH_FILE, label_issues_csv=LABEL_ISSUES_FILE, outliers_csv=OUTLIERS_FILE)


def _trainer(c: Dict[str, Any]) -> Dict[str, Any]:
    model_run = _first(c["outputs"], "model_run")
    path = model_run and os.path.join(model_run, TRAINING_LOG)
    if not path or not os.path.exists(path):
        return {}
    log = json.load(open(path))
    kept = kept_epoch(log["epochs"], monitor_of(log))
    return {
        "strategy": log["strategy"],
        "epochs": len(log["epochs"]),
        "train_seconds": log["train_seconds"],
        "kept_epoch": kept.get("epoch"),
        "kept_eval_accuracy": kept.get("val_sparse_categorical_accuracy"),
        "kept_balanced_accuracy": kept.get("val_balanced_accuracy"),
        "monitor": monitor_of(log),
        "kept_macro_auc_pr": kept.get("val_auc_pr"),  # multi-label: what training followed
        "class_balance": log.get("class_balance"),
        "warm_started_from": log.get("warm_started_from"),
        "warm_start_skipped": log.get("warm_start_skipped") or "",
        "model_run": model_run,
        "class_names": log["class_names"],
        "tflite": log.get("tflite"),
        "exports": log.get("exports"),
        "still_improving": log.get("still_improving") or [],
        "tuned": log.get("tuned"),
        "model": log["hparams"].get("model"),
        "weights": log["hparams"].get("weights", ""),
        "model_choice": log["hparams"].get("model_choice") or "",
    }


def _tuner(c: Dict[str, Any]) -> Dict[str, Any]:
    return _json_output(c, "tuner_results", TUNING_FILE)


def _evaluator(c: Dict[str, Any]) -> Dict[str, Any]:
    evaluation = _first(c["outputs"], "evaluation")
    if not evaluation:
        return {}
    blessing = (c["output_properties"].get("blessing") or [{}])[0]
    return {
        **evaluation_results.metrics(evaluation),
        "confusion": evaluation_results.confusion_matrix(evaluation),
        "views": evaluation_results.views(evaluation),
        "test": evaluation_results.test_split(evaluation),
        # where the model looked on a sample of eval images (components/evaluator/explanations.py)
        "explanations": eval_explanations.read_index(evaluation),
        "blessed": bool(blessing.get("blessed")),
        # Set by components/evaluator/executor.py when the last blessed model predicts other classes.
        "baseline_skipped": blessing.get("baseline_skipped", ""),
    }


def _model_card(c: Dict[str, Any]) -> Dict[str, Any]:
    card = _json_output(c, "model_card", CARD_JSON, card_json=CARD_JSON, card_md=CARD_MD, card_html=CARD_HTML)
    return (
        {
            "card": {k: card[k] for k in ("model", "evaluation", "training")},
            **{k: card[k] for k in ("card_json", "card_md", "card_html")},
        }
        if card
        else {}
    )


def _pusher(c: Dict[str, Any]) -> Dict[str, Any]:
    if not _first(c["outputs"], "pushed_model"):
        return {}
    pushed = (c["output_properties"].get("pushed_model") or [{}])[0]
    return {"pushed": bool(pushed.get("pushed")), "destination": pushed.get("pushed_destination", "")}


def _example_validator(c: Dict[str, Any]) -> Dict[str, Any]:
    from components.validation.gate import read_anomalies

    anomalies = _first(c["outputs"], "anomalies")
    return {"anomalies": read_anomalies(anomalies)} if anomalies else {}


def _schema(c: Dict[str, Any]) -> Dict[str, Any]:
    schema = _first(c["outputs"], "schema")
    return {"schema": os.path.join(schema, "schema.pbtxt")} if schema else {}


# The reader of each component's details, by the component's id (or the start of it).
DETAILS: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "ImageExampleGen": _ingestion,
    "DataValidationGate": _gate,
    "Transform": _transform,
    "BackboneFeatures": _features,
    "DataHealthGate": lambda c: (
        {"passed": bool(c["output_properties"]["result"][0].get("passed"))}
        if c["output_properties"].get("result")
        else {}
    ),
    "DataHealth": _health,  # after DataHealthGate: a component's kind is the first key its id starts with
    "Tuner": _tuner,
    "Trainer": _trainer,
    "Evaluator": _evaluator,
    "ModelCard": _model_card,
    "Pusher": _pusher,
    "ExampleValidator": _example_validator,
    "SchemaGen": _schema,
    "ImportSchemaGen": _schema,
}


def component_kind(name: str) -> Optional[str]:
    """The DETAILS key a component id starts with ('ImageExampleGen', 'Trainer', ...), if any."""
    return next((kind for kind in DETAILS if name.startswith(kind)), None)


def _details(c: Dict[str, Any]) -> Dict[str, Any]:
    kind = component_kind(c["component"])
    return DETAILS[kind](c) if kind else {}


def _gate_drift(c: Dict[str, Any]) -> Dict[str, Any]:
    """The gate's drift result, from its inputs and parameters (its outputs are gone when it failed)."""
    from components.validation.gate import read_profile

    limits = drift_lib.Thresholds(**{k: float(c["properties"].get(k, 1.0)) for k in drift_lib.Thresholds._fields})
    blessing = _first(c["inputs"], "baseline_blessing")
    return drift_lib.check(
        read_profile(blessing) if blessing else None,
        read_profile(_first(c["inputs"], "examples")),
        limits,
        has_baseline=blessing is not None,
    )


def _megabytes(uri: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(uri) for f in fs) / 2**20


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
