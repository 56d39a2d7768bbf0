"""The runs recorded in ML Metadata: opening the SQLite store, finding runs and their executions'
names and states, and the two things this project writes there (why a run failed, that it was
interrupted). What a run did, read from these and its artifacts, is in run_summary.py.
"""

import json
import os
import sqlite3
from typing import Any, Dict, List, Optional

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

_STATES = {
    metadata_store_pb2.Execution.COMPLETE: "ran",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.FAILED: "FAILED",
    metadata_store_pb2.Execution.RUNNING: "running",
    metadata_store_pb2.Execution.NEW: "new",
    metadata_store_pb2.Execution.CANCELED: "canceled",
}

ERROR_PROPERTY = "imagepipe_error"  # set by the local runner on the execution that failed
SQLITE_HEADER = b"SQLite format 3\x00"


class NoMetadata(LookupError):
    """No ML Metadata store (or no run in it) where one was expected."""


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
        raise NoMetadata(
            f"{metadata_path}: not an ML Metadata store ({problem}); move it away (the next run "
            "starts a new one) or use another --root"
        )
    damage = _sqlite_damage(metadata_path)
    if damage:
        raise NoMetadata(
            f"{metadata_path}: a damaged ML Metadata store ({damage}); restore it from a backup, or move "
            "it away (the next run starts a new one) or use another --root"
        )


def _sqlite_damage(path: str) -> str:
    """What SQLite finds wrong with the database at `path` ("" when nothing): a truncated or overwritten
    store has the right header, and ML Metadata's own error comes late, as a query and a traceback."""

    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = [row[0] for row in connection.execute("PRAGMA quick_check(1)")]
        finally:
            connection.close()
    except sqlite3.Error as e:
        return str(e)
    return "" if found == ["ok"] else found[0]


def open_store(metadata_path: str, writable: bool = False) -> metadata_store.MetadataStore:
    if not os.path.exists(metadata_path):
        raise NoMetadata(
            f"no ML Metadata at {metadata_path}; run 'imagepipe run' first (with the same --root and --name)"
        )
    check_store_file(metadata_path)
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = (
        metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE
        if writable
        else metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    )
    return metadata_store.MetadataStore(config)


def runs(store) -> List[metadata_store_pb2.Context]:
    """Pipeline runs, newest first."""
    return sorted(
        store.get_contexts_by_type("pipeline_run"), key=lambda r: (r.create_time_since_epoch, r.id), reverse=True
    )


def find_run(
    recorded: List[metadata_store_pb2.Context], metadata_path: str, run_id: Optional[str]
) -> metadata_store_pb2.Context:
    if not recorded:
        raise NoMetadata(f"{metadata_path}: no pipeline run recorded yet; run 'imagepipe run' first")
    if run_id is None:
        return recorded[0]
    run = next((r for r in recorded if r.name == run_id), None)
    if run is None:
        raise NoMetadata(f"run {run_id!r} not found in {metadata_path}; 'imagepipe runs' lists them")
    return run


def pipeline_of_run(root: str, pipelines: Dict[str, str], run_id: Optional[str] = None) -> str:
    """The pipeline under `root` ({name: metadata path}) whose metadata holds run `run_id`, or the newest run's
    when None."""
    newest = None
    for name, path in pipelines.items():
        for run in runs(open_store(path)):
            if run_id is None or run.name == run_id:
                if newest is None or run.create_time_since_epoch > newest[0]:
                    newest = (run.create_time_since_epoch, name)
                break
    if newest is None and run_id:
        raise NoMetadata(
            f"run {run_id!r} not found in any pipeline under {root}; 'imagepipe runs --root {root}' lists them"
        )
    if newest is None:
        raise NoMetadata(f"no run recorded under {root}; run 'imagepipe run' first (with the same --root)")
    return newest[1]


def node_name(store, execution) -> str:
    return next(
        (c.name.split(".", 1)[-1] for c in store.get_contexts_by_execution(execution.id) if c.type == "node"),
        execution.type,
    )


def state_name(execution) -> str:
    return _STATES.get(execution.last_known_state, "unknown")


def scalars(properties) -> Dict[str, Any]:
    return {
        k: getattr(v, v.WhichOneof("value"))
        for k, v in properties.items()
        if v.WhichOneof("value") in ("int_value", "string_value", "double_value")
    }


def execution_error(execution) -> str:
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

    in_progress: whether a run of the pipeline holds its lock now (runs/run_lock.py); a run
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
    """Marks the unfinished executions of the run started after since_ms as canceled (an interrupted run),
    and the one the interruption made fail (TFX marks it FAILED; no error was recorded for it)."""
    run = newest_run_since(metadata_path, since_ms)
    if run is None:
        return
    store = open_store(metadata_path, writable=True)
    stopped = (metadata_store_pb2.Execution.RUNNING, metadata_store_pb2.Execution.NEW)
    unfinished = [
        e
        for e in store.get_executions_by_context(run.id)
        if e.last_known_state in stopped
        or (e.last_known_state == metadata_store_pb2.Execution.FAILED and ERROR_PROPERTY not in e.custom_properties)
    ]
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
    failed = [
        e for e in store.get_executions_by_context(run.id) if e.last_known_state == metadata_store_pb2.Execution.FAILED
    ]
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
    found = runs(store)
    return found[0] if found and found[0].create_time_since_epoch >= since_ms else None
