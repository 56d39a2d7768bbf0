"""What each component of a run did, read back from ML Metadata and the artifacts.

`summarize(metadata_path)` returns plain dicts (tests assert on them);
`format_summary()` turns them into the lines `imagepipe run` prints.
"""

import json
import os
from typing import Any, Dict, List, Optional

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from components import drift as drift_lib
from components.image_example_gen import QUARANTINE_FILE, SUMMARY_FILE
from components.image_example_gen.sources import split_sort_key
from pipeline import run_lock

# Written by the gate (components/validation_gate.py) and the Trainer (trainer/task.py); named here
# so that listing runs needs neither TFX nor TensorFlow.
GATE_RESULT_FILE = "anomalies.json"
GATE_DRIFT_FILE = "drift.json"
TRAINING_LOG = "training.json"

_STATES = {metadata_store_pb2.Execution.COMPLETE: "ran", metadata_store_pb2.Execution.CACHED: "cached",
           metadata_store_pb2.Execution.FAILED: "FAILED", metadata_store_pb2.Execution.RUNNING: "running",
           metadata_store_pb2.Execution.NEW: "new", metadata_store_pb2.Execution.CANCELED: "canceled"}


ERROR_PROPERTY = "imagepipe_error"  # set by the local runner on the execution that failed


class NoMetadata(LookupError):
    """No ML Metadata store (or no run in it) where one was expected."""


SQLITE_HEADER = b"SQLite format 3\x00"


def check_store_file(metadata_path: str) -> None:
    """A store that exists must be an SQLite database: not a folder, an empty or a garbage file."""
    if not os.path.exists(metadata_path):
        return
    problem = None
    if not os.path.isfile(metadata_path):
        problem = "a folder, not a file"
    elif os.path.getsize(metadata_path) == 0:
        problem = "an empty file"
    else:
        with open(metadata_path, "rb") as f:
            if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                problem = "not an SQLite database"
    if problem:
        raise NoMetadata(f"{metadata_path}: not an ML Metadata store ({problem}); move it away (the next run "
                         "starts a new one) or use another --root")


def open_store(metadata_path: str, writable: bool = False) -> metadata_store.MetadataStore:
    if not os.path.exists(metadata_path):
        raise NoMetadata(f"no ML Metadata at {metadata_path}; run 'imagepipe run' first (with the same "
                         "--root and --name)")
    check_store_file(metadata_path)
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = (metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE if writable
                                     else metadata_store_pb2.SqliteMetadataSourceConfig.READONLY)
    return metadata_store.MetadataStore(config)


def _runs(store) -> List[metadata_store_pb2.Context]:
    """Pipeline runs, newest first."""
    return sorted(store.get_contexts_by_type("pipeline_run"),
                  key=lambda r: (r.create_time_since_epoch, r.id), reverse=True)


def _find_run(runs: List[metadata_store_pb2.Context], metadata_path: str,
              run_id: Optional[str]) -> metadata_store_pb2.Context:
    if not runs:
        raise NoMetadata(f"{metadata_path}: no pipeline run recorded yet; run 'imagepipe run' first")
    if run_id is None:
        return runs[0]
    run = next((r for r in runs if r.name == run_id), None)
    if run is None:
        raise NoMetadata(f"run {run_id!r} not found in {metadata_path}; 'imagepipe runs' lists them")
    return run


def pipeline_of_run(root: str, run_id: Optional[str] = None) -> str:
    """The pipeline under `root` whose metadata holds run `run_id`, or the newest run when None."""
    from pipeline.config import PipelineConfig, pipelines_in_root

    newest = None
    for name in pipelines_in_root(root):
        path = PipelineConfig(root=root, name=name).metadata_path
        for run in _runs(open_store(path)):
            if run_id is None or run.name == run_id:
                if newest is None or run.create_time_since_epoch > newest[0]:
                    newest = (run.create_time_since_epoch, name)
                break
    if newest is None and run_id:
        raise NoMetadata(f"run {run_id!r} not found in any pipeline under {root}; 'imagepipe runs --root {root}' "
                         "lists them")
    if newest is None:
        raise NoMetadata(f"no run recorded under {root}; run 'imagepipe run' first (with the same --root)")
    return newest[1]


def node_name(store, execution) -> str:
    return next((c.name.split(".", 1)[-1] for c in store.get_contexts_by_execution(execution.id)
                 if c.type == "node"), execution.type)


def state_name(execution) -> str:
    return _STATES.get(execution.last_known_state, "unknown")


def _scalars(properties) -> Dict[str, Any]:
    return {k: getattr(v, v.WhichOneof("value")) for k, v in properties.items()
            if v.WhichOneof("value") in ("int_value", "string_value", "double_value")}


def _error(execution) -> str:
    if ERROR_PROPERTY in execution.custom_properties:
        return execution.custom_properties[ERROR_PROPERTY].string_value
    if "__execution_result__" in execution.custom_properties:
        raw = execution.custom_properties["__execution_result__"].string_value
        try:
            return json.loads(raw).get("resultMessage", raw)
        except ValueError:
            return raw
    return ""


def run_status(components: List[Dict[str, Any]], in_progress: bool = True) -> str:
    """complete, failed (stopped at a component), running, or interrupted (stopped or killed mid-run).

    in_progress: whether a run of the pipeline holds its lock now (pipeline/run_lock.py); a run
    that looks unfinished while none does was killed.
    """
    states = [c["state"] for c in components]
    if "FAILED" in states:
        return "failed"
    if "canceled" in states:
        return "interrupted"
    if any(state in ("running", "new") for state in states):
        return "running" if in_progress else "interrupted"
    return "complete"


def record_interruption(metadata_path: str, since_ms: int) -> None:
    """Marks the unfinished executions of the run started after since_ms as canceled (an interrupted run)."""
    run = newest_run_since(metadata_path, since_ms)
    if run is None:
        return
    store = open_store(metadata_path, writable=True)
    unfinished = [e for e in store.get_executions_by_context(run.id)
                  if e.last_known_state in (metadata_store_pb2.Execution.RUNNING, metadata_store_pb2.Execution.NEW)]
    for execution in unfinished:
        execution.last_known_state = metadata_store_pb2.Execution.CANCELED
    if unfinished:
        store.put_executions(unfinished)


def record_failure(metadata_path: str, message: str, since_ms: int) -> None:
    """Stores the error of the failed execution of the run started after since_ms, for runs and reports.

    TFX records that an execution failed, but not why when the executor raised an exception.
    Nothing happens when that run never reached ML Metadata (it failed before any component).
    """
    run = newest_run_since(metadata_path, since_ms)
    if run is None:
        return
    store = open_store(metadata_path, writable=True)
    failed = [e for e in store.get_executions_by_context(run.id)
              if e.last_known_state == metadata_store_pb2.Execution.FAILED]
    for execution in failed:
        execution.custom_properties[ERROR_PROPERTY].string_value = message[:20000]
    if failed:
        store.put_executions(failed)


def newest_run_since(metadata_path: str, since_ms: int) -> Optional[metadata_store_pb2.Context]:
    """The newest run created at or after since_ms (milliseconds since the epoch), if any."""
    if not os.path.exists(metadata_path):
        return None
    return newest_run(open_store(metadata_path), since_ms)


def newest_run(store, since_ms: int) -> Optional[metadata_store_pb2.Context]:
    runs = _runs(store)
    return runs[0] if runs and runs[0].create_time_since_epoch >= since_ms else None


def list_runs(metadata_path: str) -> List[Dict[str, Any]]:
    """Every run, newest first: id, start, duration, status, component states, accuracy, blessing."""
    store = open_store(metadata_path)
    in_progress = run_lock.held(metadata_path)
    out = []
    for run in _runs(store):
        executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
        components = [{"component": node_name(store, e), "state": state_name(e), "error": _error(e)}
                      for e in executions]
        evaluation = next((e for e, c in zip(executions, components) if c["component"] == "Evaluator"), None)
        accuracy = blessed = None
        if evaluation is not None:
            details = _evaluator_details(store, evaluation)
            accuracy, blessed = details.get("accuracy"), details.get("blessed")
        failed = next((c for c in components if c["state"] == "FAILED"), None)
        ends = [e.last_update_time_since_epoch for e in executions] or [run.create_time_since_epoch]
        out.append({
            "run_id": run.name, "started_ms": run.create_time_since_epoch,
            "seconds": round((max(ends) - run.create_time_since_epoch) / 1000, 1),
            # Only the newest run can still be going: an older unfinished one was interrupted.
            "status": run_status(components, in_progress and not out), "components": components,
            "failed_component": failed["component"] if failed else None,
            "error": failed["error"] if failed else "",
            "accuracy": accuracy, "blessed": blessed,
        })
    return out


def _evaluator_details(store, execution) -> Dict[str, Any]:
    events = [e for e in store.get_events_by_execution_ids([execution.id]) if e.type == metadata_store_pb2.Event.OUTPUT]
    found: Dict[str, Any] = {}
    for event, artifact in zip(events, store.get_artifacts_by_id([e.artifact_id for e in events])):
        key = event.path.steps[0].key if event.path.steps else ""
        if key == "blessing":
            found["blessed"] = bool(_scalars(artifact.custom_properties).get("blessed"))
        elif key == "evaluation":
            try:
                found["accuracy"] = evaluation_metrics(artifact.uri)["accuracy"]
            except Exception:  # noqa: BLE001 - a deleted or unreadable evaluation: no figure
                found["accuracy"] = None
    return found


def summarize(metadata_path: str, run_id: Optional[str] = None) -> Dict[str, Any]:
    """The newest run (or `run_id`): its id and, per executed component, state, seconds, outputs."""
    store = open_store(metadata_path)
    runs = _runs(store)
    run = _find_run(runs, metadata_path, run_id)
    components = []
    for execution in sorted(store.get_executions_by_context(run.id), key=lambda e: e.id):
        node = node_name(store, execution)
        outputs: Dict[str, List[str]] = {}
        properties: Dict[str, List[Dict[str, Any]]] = {}
        inputs: Dict[str, List[str]] = {}
        events = store.get_events_by_execution_ids([execution.id])
        artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in events])}
        for event in events:
            key = event.path.steps[0].key if event.path.steps else "output"
            artifact = artifacts[event.artifact_id]
            if event.type == metadata_store_pb2.Event.INPUT:
                inputs.setdefault(key, []).append(artifact.uri)
            elif event.type == metadata_store_pb2.Event.OUTPUT:
                outputs.setdefault(key, []).append(artifact.uri)
                properties.setdefault(key, []).append(_scalars(artifact.custom_properties))
        components.append({
            "component": node,
            "execution_id": execution.id,
            "state": state_name(execution),
            "started_ms": execution.create_time_since_epoch,
            "seconds": round((execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000, 1),
            "inputs": inputs,
            "outputs": outputs,
            "output_properties": properties,
            "properties": _scalars(execution.custom_properties),
            "error": _error(execution),
        })
    for c in components:
        c["details"] = _details(c)
    trainer = next((c["details"] for c in components if c["component"] == "Trainer"), {})
    for c in components:
        if c["component"] == "Evaluator" and c["details"] and trainer.get("class_names"):
            c["details"]["per_class"] = per_class_metrics(c["details"]["confusion"], trainer["class_names"])
    status = run_status(components, runs[0].id == run.id and run_lock.held(metadata_path))
    return {"run_id": run.name, "started_ms": run.create_time_since_epoch, "status": status,
            "metadata_path": metadata_path, "components": components}


def _first(outputs: Dict[str, List[str]], key: str) -> Optional[str]:
    uris = outputs.get(key) or []
    return uris[0] if uris else None


def _details(c: Dict[str, Any]) -> Dict[str, Any]:
    """Component-specific facts worth printing."""
    name, outputs = c["component"], c["outputs"]
    if name.startswith("ImageExampleGen") and _first(outputs, "report"):
        report = _first(outputs, "report")
        path = os.path.join(report, SUMMARY_FILE)
        if os.path.exists(path):
            return {**json.load(open(path)), "quarantine_csv": os.path.join(report, QUARANTINE_FILE)}
    if name.startswith("DataValidationGate") and _first(outputs, "result"):
        path = os.path.join(_first(outputs, "result"), GATE_RESULT_FILE)
        if os.path.exists(path):
            anomalies = json.load(open(path))
            drift_path = os.path.join(_first(outputs, "result"), GATE_DRIFT_FILE)
            drift = json.load(open(drift_path)) if os.path.exists(drift_path) else {"skipped": "not checked"}
            drifted = [check for check in drift.get("checks", []) if check["drifted"]]
            return {"anomalies": anomalies, "drift": drift, "drifted": drifted,
                    "passed": not anomalies and not drifted}
    if name.startswith("DataValidationGate") and c["state"] == "FAILED" and _first(c["inputs"], "examples"):
        # A failed execution's outputs are removed: the drift is computed again from its inputs, for the report.
        return {"drift": _gate_drift(c), "stopped": True}
    if name.startswith("Transform") and _first(outputs, "transformed_examples"):
        return {"transformed_megabytes": round(_megabytes(_first(outputs, "transformed_examples")), 2)}
    if name.startswith("Trainer") and _first(outputs, "model_run"):
        path = os.path.join(_first(outputs, "model_run"), TRAINING_LOG)
        if os.path.exists(path):
            log = json.load(open(path))
            kept = kept_epoch(log["epochs"])
            return {"strategy": log["strategy"], "epochs": len(log["epochs"]), "train_seconds": log["train_seconds"],
                    "kept_epoch": kept.get("epoch"), "kept_eval_accuracy": kept.get("val_sparse_categorical_accuracy"),
                    "warm_started_from": log.get("warm_started_from"),
                    "warm_start_skipped": log.get("warm_start_skipped") or "",
                    "model_run": _first(outputs, "model_run"), "class_names": log["class_names"],
                    "tflite": log.get("tflite")}
    if name.startswith("Evaluator") and _first(outputs, "evaluation"):
        blessing = (c["output_properties"].get("blessing") or [{}])[0]
        evaluation = _first(outputs, "evaluation")
        return {**evaluation_metrics(evaluation), "confusion": confusion_matrix(evaluation),
                "blessed": bool(blessing.get("blessed")),
                # Set by components/model_evaluator.py when the last blessed model predicts other classes.
                "baseline_skipped": blessing.get("baseline_skipped", "")}
    if name.startswith("Pusher") and _first(outputs, "pushed_model"):
        pushed = (c["output_properties"].get("pushed_model") or [{}])[0]
        return {"pushed": bool(pushed.get("pushed")), "destination": pushed.get("pushed_destination", "")}
    if name.startswith("ExampleValidator") and _first(outputs, "anomalies"):
        from components.validation_gate import read_anomalies

        return {"anomalies": read_anomalies(_first(outputs, "anomalies"))}
    if "SchemaGen" in name and _first(outputs, "schema"):
        return {"schema": os.path.join(_first(outputs, "schema"), "schema.pbtxt")}
    return {}


def _gate_drift(c: Dict[str, Any]) -> Dict[str, Any]:
    """The gate's drift result, from its inputs and parameters (its outputs are gone when it failed)."""
    from components.validation_gate import read_profile

    limits = drift_lib.Thresholds(**{k: float(c["properties"].get(k, 1.0)) for k in drift_lib.Thresholds._fields})
    blessing = _first(c["inputs"], "baseline_blessing")
    return drift_lib.check(read_profile(blessing) if blessing else None,
                           read_profile(_first(c["inputs"], "examples")), limits, has_baseline=blessing is not None)


def kept_epoch(epochs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The epoch whose weights the model has: early stopping restores the lowest eval loss of the last
    training phase (trainer/task.py), so the Evaluator scores that epoch, not the most accurate one."""
    if not epochs:
        return {}
    last_phase = [e for e in epochs if e.get("phase") == epochs[-1].get("phase")]
    return min(last_phase, key=lambda e: e.get("val_loss", float("inf")))


def _megabytes(uri: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(uri) for f in fs) / 2**20


def evaluation_metrics(evaluation_uri: str) -> Dict[str, Any]:
    """Overall accuracy and example count of the candidate (and baseline), and the validation verdict."""
    import tensorflow_model_analysis as tfma

    found: Dict[str, Any] = {"accuracy": None, "baseline_accuracy": None, "example_count": None,
                             "failures": []}
    for metrics in tfma.load_metrics(evaluation_uri):
        if metrics.slice_key.single_slice_keys:
            continue  # overall slice only
        for kv in metrics.metric_keys_and_values:
            key = kv.key
            if key.HasField("sub_key") or key.is_diff or not kv.value.HasField("double_value"):
                continue
            value = kv.value.double_value.value
            if key.name == "sparse_categorical_accuracy":
                found["baseline_accuracy" if key.model_name == "baseline" else "accuracy"] = value
            elif key.name == "example_count" and key.model_name != "baseline":
                found["example_count"] = int(value)
    validation = tfma.load_validation_result(evaluation_uri)
    for per_slice in validation.metric_validations_per_slice:
        for failure in per_slice.failures:
            found["failures"].append(_failure_text(failure, found))
    return found


def _failure_text(failure, found: Dict[str, Any]) -> str:
    """What failed, with the value and the bound (TFMA's own message is often empty)."""
    name, threshold = failure.metric_key.name, failure.metric_threshold
    value = failure.metric_value.double_value.value if failure.metric_value.HasField("double_value") else None
    has_bound = threshold.HasField("value_threshold") and threshold.value_threshold.HasField("lower_bound")
    if failure.metric_key.is_diff and found.get("baseline_accuracy") is not None and found.get("accuracy") is not None:
        return f"{name} {found['accuracy']:.4f} is below the last blessed model's {found['baseline_accuracy']:.4f}"
    if has_bound and value is not None:
        return f"{name} {value:.4f} is below the threshold {threshold.value_threshold.lower_bound.value:.4f}"
    return f"{name}: {failure.message or 'failed its threshold'}"


def confusion_matrix(evaluation_uri: str) -> List[List[int]]:
    """The candidate's [actual class id, predicted class id, count] entries (argmax predictions)."""
    import tensorflow_model_analysis as tfma

    for plots in tfma.load_plots(evaluation_uri):
        if plots.slice_key.single_slice_keys:
            continue
        for kv in plots.plot_keys_and_values:
            if kv.key.model_name == "baseline" or not kv.value.HasField("multi_class_confusion_matrix_at_thresholds"):
                continue
            matrix = kv.value.multi_class_confusion_matrix_at_thresholds.matrices[0]
            return [[e.actual_class_id, e.predicted_class_id, int(e.num_weighted_examples)] for e in matrix.entries]
    return []


def per_class_metrics(confusion: List[List[int]], class_names: List[str]) -> Dict[str, Dict[str, float]]:
    """Precision, recall and support per class, from the confusion matrix."""
    out = {}
    for class_id, name in enumerate(class_names):
        true_positive = sum(n for a, p, n in confusion if a == p == class_id)
        actual = sum(n for a, _, n in confusion if a == class_id)
        predicted = sum(n for _, p, n in confusion if p == class_id)
        out[name] = {"precision": true_positive / predicted if predicted else 0.0,
                     "recall": true_positive / actual if actual else 0.0, "support": actual}
    return out


def describe_tflite(record: Dict[str, Any]) -> str:
    """The Trainer's TFLite exports in a phrase: each one's eval accuracy next to the SavedModel's."""
    if "error" in record:
        return f"TFLite export failed: {record['error']}"
    models = ", ".join(f"{kind} {m['accuracy']:.4f} ({m['bytes'] / 1024:,.0f} KB)" for kind, m in record["models"].items())
    return f"TFLite {models} vs SavedModel {record['savedmodel_accuracy']:.4f} on {record['examples']:,} eval examples"


def format_summary(summary: Dict[str, Any]) -> List[str]:
    lines = [f"run {summary['run_id']}"]
    width = max((len(c["component"]) for c in summary["components"]), default=0)
    for c in summary["components"]:
        lines.append(f"  {c['component']:<{width}} {c['state']:<7} {c['seconds']:>6.1f} s  {_one_line(c)}".rstrip())
    return lines


def _one_line(c: Dict[str, Any]) -> str:
    d = c["details"]
    name = c["component"]
    if name.startswith("ImageExampleGen") and d:
        splits = ", ".join(f"{s} {n:,}" for s, n in sorted(d["examples_per_split"].items(),
                                                            key=lambda kv: split_sort_key(kv[0])))
        reasons = ", ".join(f"{r} {n}" for r, n in d["quarantine_reasons"].items())
        text = (f"{d['files_seen']:,} files -> {d['examples_written']:,} examples ({splits}), "
                f"{d['quarantined']:,} quarantined" + (f" ({reasons})" if reasons else "")
                + f", {len(d['label_map'])} classes")
        if d.get("duplicate_groups"):
            text += f", {d['duplicate_files']} files in {d['duplicate_groups']} duplicate groups"
        if d.get("downscaled"):
            text += f", {d['downscaled']:,} stored downscaled (above {d['store_max_pixels']:,} pixels)"
        return text
    if name.startswith("DataValidationGate") and d and not d.get("stopped"):
        drift = d["drift"]
        classes = drift_lib.describe_classes(drift) or ""
        if d["passed"]:
            compared = ("no drift from the last blessed model's data" if "checks" in drift
                        else f"drift not checked: {drift['skipped']}")
            return f"passed: no anomalies, {compared}" + (f"; {classes}" if classes else "")
        problems = [f"[{a['split']}] {a['feature']}: {a['short']}" for a in d["anomalies"]]
        problems += [f"[drift] {drift_lib.describe_check(check)}" for check in d["drifted"]]
        return (f"{len(d['anomalies'])} anomalies, {len(d['drifted'])} drifted (warn only): "
                + "; ".join(problems) + (f"; {classes}" if classes else ""))
    if name.startswith("DataValidationGate") and c["state"] == "FAILED":
        return "stopped the run: " + (c["error"].splitlines()[0][:200] if c["error"] else "anomalies or drift found")
    if name.startswith("ExampleValidator") and d:
        return f"{len(d['anomalies'])} anomalies"
    if name.startswith("Transform") and d:
        return f"{d['transformed_megabytes']:.1f} MB of resized uint8 pixels"
    if name.startswith("Trainer") and d:
        accuracy = d["kept_eval_accuracy"]
        return (f"{d['epochs']} epochs on {d['strategy']}"
                + (f", kept epoch {d['kept_epoch']} (lowest eval loss): eval accuracy {accuracy:.4f}"
                   if accuracy is not None else "")
                + (", warm-started" if d.get("warm_started_from") else "")
                + (f", not warm-started: {d['warm_start_skipped']}" if d.get("warm_start_skipped") else "")
                + (f"; {describe_tflite(d['tflite'])}" if d.get("tflite") else ""))
    if name.startswith("Evaluator") and d:
        text = f"accuracy {d['accuracy']:.4f} on {d['example_count']:,} eval examples" if d["accuracy"] is not None else ""
        if d["baseline_accuracy"] is not None:
            text += f" (last blessed model: {d['baseline_accuracy']:.4f})"
        if d.get("baseline_skipped"):
            text += f" (not compared: {d['baseline_skipped']}; judged on the threshold alone)"
        return text + (", BLESSED" if d["blessed"] else ", not blessed: " + "; ".join(d["failures"])[:300])
    if name.startswith("Pusher") and d:
        return f"pushed to {d['destination']}" if d["pushed"] else "not pushed (model not blessed)"
    if "schema" in d:
        return d["schema"]
    if c["state"] == "FAILED" and c["error"]:
        return c["error"].splitlines()[0][:200]
    return ""

