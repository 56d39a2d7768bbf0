"""A finished run's stage, run again alone: the inputs and parameters of its last execution (read from the root's
ML Metadata), and another checkout's code put first on the path (a git worktree of an older commit), so two
versions of a stage can be compared on the same inputs (transform_, features_, health_, trainer_ and
evaluator_stage_benchmark.py)."""

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, List

from bench import measure_in_fresh_process

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_code(tree: str) -> None:
    """Imports the project's modules from `tree` from now on: the ones imported from this checkout are forgotten
    (call before the stage's are imported)."""
    sys.path.insert(0, os.path.abspath(tree))
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name != "__main__" and path.startswith(CHECKOUT + os.sep) and "site-packages" not in path:
            del sys.modules[name]


def _store_and_execution(root: str, component: str):
    """The root's ML Metadata store and the last execution of the component whose type name ends in `component`."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    [db] = glob.glob(os.path.join(root, "metadata", "*", "metadata.db"))
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = db
    store = metadata_store.MetadataStore(config)
    execution = [
        e for e in store.get_executions() if store.get_execution_types_by_id([e.type_id])[0].name.endswith(component)
    ][-1]
    return store, execution


def _artifacts(store, execution, event_type) -> dict:
    """{key: [artifact]} of the execution's events of `event_type` (INPUT or OUTPUT)."""
    from tfx.types import artifact_utils

    found = {}
    for event in store.get_events_by_execution_ids([execution.id]):
        if event.type != event_type:
            continue
        [artifact] = store.get_artifacts_by_id([event.artifact_id])
        [kind] = store.get_artifact_types_by_id([artifact.type_id])
        found.setdefault(event.path.steps[0].key, []).append(artifact_utils.deserialize_artifact(kind, artifact))
    return found


def last_execution(root: str, component: str):
    """(input_dict, exec_properties) of the last execution of the component whose type name ends in `component`."""
    from ml_metadata.proto import metadata_store_pb2

    store, execution = _store_and_execution(root, component)
    properties = {
        name: getattr(value, value.WhichOneof("value"))
        for name, value in execution.custom_properties.items()
        if not name.startswith("__")
    }
    return _artifacts(store, execution, metadata_store_pb2.Event.INPUT), properties


def fresh_outputs(root: str, component: str, folder: str) -> dict:
    """An output_dict like the last execution's, each artifact of its type but new and empty, at folder/<key>."""
    from ml_metadata.proto import metadata_store_pb2
    from tfx.types import artifact_utils

    store, execution = _store_and_execution(root, component)
    outputs = {}
    for key, artifacts in _artifacts(store, execution, metadata_store_pb2.Event.OUTPUT).items():
        fresh = artifact_utils.deserialize_artifact(artifacts[0].artifact_type, metadata_store_pb2.Artifact())
        fresh.uri = os.path.join(folder, key)
        os.makedirs(fresh.uri, exist_ok=True)
        outputs[key] = [fresh]
    return outputs


def stage_main(
    doc: str, measure: Callable, compare: Callable, extra: Callable = lambda parser: None, rounds: int = 1
) -> None:
    """The command line of a stage benchmark: with --measure, `measure(root, args)` once in this process, printed as
    one JSON line (--code: another checkout's stage); else `compare(root, {"this": ..., "baseline": ...}, args)`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--root", required=True, help="a finished run's root (its metadata/ and artifacts)")
    parser.add_argument("--baseline", default="", help="another checkout's tree to compare with (a git worktree)")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--measure", action="store_true", help="one measurement in this process, as one JSON line")
    parser.add_argument("--code", default="", help="with --measure: the checkout whose stage runs (else this one)")
    extra(parser)
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.measure:
        if args.code:  # before any of the stage's modules is imported
            use_code(args.code)
        print(json.dumps(measure(root, args)))
        return
    compare(root, {"this": CHECKOUT, "baseline": os.path.abspath(args.baseline)}, args)


def compare_in_turn(
    module: str, root: str, trees: dict, rounds: int, extra: List[str], header: List[str], cells
) -> None:
    """The trees in turn, `rounds` times, each a fresh process (`python -m module --measure`); a table of each tree's
    seconds (min / median / max) and peak, then `cells(its last measurement)` under `header`; then this / baseline."""
    runs = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            runs[name].append(measure_in_fresh_process(module, ["--measure", "--root", root, *extra, "--code", tree]))
    print("| code | seconds (min / median / max) | peak GB | " + " | ".join(header) + " |")
    print("|---|---|---|" + "---|" * len(header))
    for name, found in runs.items():
        seconds = sorted(r["seconds"] for r in found)
        spread = f"{seconds[0]:.1f} / {statistics.median(seconds):.1f} / {seconds[-1]:.1f}"
        print(f"| {name} | {spread} | {max(r['peak_gb'] for r in found):.2f} | " + " | ".join(cells(found[-1])) + " |")
    this, base = (statistics.median(r["seconds"] for r in found) for found in runs.values())
    print(f"this / baseline: {this / base:.2f}x")


def run_alone(root: str, component: str, executor_class, findings: Callable[[dict], dict], properties=None) -> dict:
    """Runs the root's last `component` execution again in this process, its outputs in a fresh folder (removed after):
    {seconds, peak_gb (this process tree's), **findings(output_dict)}. `properties(exec_properties, folder)` may
    change the run's parameters first."""
    from tfx.dsl.components.base import base_beam_executor

    from bench.scale_benchmark import TreeSampler

    inputs, exec_properties = last_execution(root, component)
    folder = tempfile.mkdtemp(prefix=f"{component.lower()}-stage-")
    if properties is not None:
        properties(exec_properties, folder)
    outputs = fresh_outputs(root, component, folder)
    context = base_beam_executor.BaseBeamExecutor.Context(
        beam_pipeline_args=[], tmp_dir=os.path.join(folder, ".tmp"), unique_id="bench"
    )
    sampler = TreeSampler(os.getpid())
    sampler.start()
    started = time.monotonic()
    executor_class(context).Do(inputs, outputs, exec_properties)
    seconds = time.monotonic() - started
    sampler.stop()
    try:
        return {"seconds": round(seconds, 2), "peak_gb": round(sampler.peak() / 1e9, 2), **findings(outputs)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
