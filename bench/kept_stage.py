"""A finished run's stage, run again alone: the inputs and parameters of its last execution (read from the root's
ML Metadata), and another checkout's code put first on the path (a git worktree of an older commit), so two
versions of a stage can be compared on the same inputs (health_stage_benchmark.py, evaluator_stage_benchmark.py)."""

import glob
import os
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_code(tree: str) -> None:
    """Imports the project's modules from `tree` from now on: the ones imported from this checkout are forgotten
    (call before the stage's are imported)."""
    sys.path.insert(0, os.path.abspath(tree))
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name != "__main__" and path.startswith(CHECKOUT + os.sep) and "site-packages" not in path:
            del sys.modules[name]


def last_execution(root: str, component: str):
    """(input_dict, exec_properties) of the last execution of the component whose type name ends in `component`."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tfx.types import artifact_utils

    [db] = glob.glob(os.path.join(root, "metadata", "*", "metadata.db"))
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = db
    store = metadata_store.MetadataStore(config)
    execution = [
        e for e in store.get_executions() if store.get_execution_types_by_id([e.type_id])[0].name.endswith(component)
    ][-1]
    inputs = {}
    for event in store.get_events_by_execution_ids([execution.id]):
        if event.type != metadata_store_pb2.Event.INPUT:
            continue
        [artifact] = store.get_artifacts_by_id([event.artifact_id])
        [kind] = store.get_artifact_types_by_id([artifact.type_id])
        inputs.setdefault(event.path.steps[0].key, []).append(artifact_utils.deserialize_artifact(kind, artifact))
    properties = {
        name: getattr(value, value.WhichOneof("value"))
        for name, value in execution.custom_properties.items()
        if not name.startswith("__")
    }
    return inputs, properties
