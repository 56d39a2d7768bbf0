"""Runs that do not end normally: killed with SIGKILL during training (then started again, it
completes without redoing finished work or consuming the half-written model), stopped with SIGTERM
(recorded as interrupted, with a report), and two runs started at once on one root (they take
turns; each gets its own results)."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ml_metadata.proto import metadata_store_pb2

from pipeline import local_runner, run_summary
from pipeline.config import SAMPLE_SCHEMA, PipelineConfig

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)

IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


def test_killed_trainer_then_rerun(tmp_path, small_digits):
    config = PipelineConfig(root=str(tmp_path / "out"), data=small_digits, schema=SAMPLE_SCHEMA, epochs=6)
    proc = subprocess.Popen(
        [IMAGEPIPE, "run", "--root", config.root, "--data", small_digits, "--schema", SAMPLE_SCHEMA, "--epochs", "6"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    model_run = os.path.join(config.pipeline_root, "Trainer", "model_run", "*", "*")
    deadline = time.monotonic() + 300
    while not glob.glob(model_run):  # TensorBoard's first files: the Trainer is training
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the Trainer never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = run_summary.summarize(config.metadata_path)
    states = {c["component"]: c["state"] for c in killed["components"]}
    assert states["Trainer"] == "running" and "Evaluator" not in states
    assert killed["status"] == "interrupted"  # nobody holds the pipeline's lock any more
    assert run_summary.list_runs(config.metadata_path)[0]["status"] == "interrupted"

    rerun = local_runner.run(config)
    states = {c["component"]: c["state"] for c in rerun["components"]}
    for finished in ("ImageExampleGen", "StatisticsGen", "ImportSchemaGen", "ExampleValidator",
                     "DataValidationGate", "Transform"):
        assert states[finished] == "cached", finished
    assert states["Trainer"] == states["Evaluator"] == "ran"

    # Only the new Trainer's model was published, and that is what the Evaluator read.
    store = run_summary.open_store(config.metadata_path)
    models = [a for a in store.get_artifacts_by_type("Model") if a.state == metadata_store_pb2.Artifact.LIVE]
    new_trainer = next(c for c in rerun["components"] if c["component"] == "Trainer")
    assert [m.uri for m in models] == new_trainer["outputs"]["model"]
    evaluator = next(c for c in rerun["components"] if c["component"] == "Evaluator")
    inputs = [e for e in store.get_events_by_execution_ids([evaluator["execution_id"]])
              if e.type == metadata_store_pb2.Event.INPUT]
    read = {a.uri for a in store.get_artifacts_by_id([e.artifact_id for e in inputs])}
    assert new_trainer["outputs"]["model"][0] in read


def _start_when_training(args, pipeline_root):
    proc = subprocess.Popen([IMAGEPIPE, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not glob.glob(os.path.join(pipeline_root, "Trainer", "model_run", "*", "*")):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "the Trainer never started"
        time.sleep(0.05)
    return proc


def test_stopped_run_is_recorded_as_interrupted_with_a_report(tmp_path, small_digits):
    config = PipelineConfig(root=str(tmp_path / "out"), data=small_digits, schema=SAMPLE_SCHEMA, epochs=200)
    proc = _start_when_training(["--root", config.root, "--data", small_digits, "--schema", SAMPLE_SCHEMA,
                                 "--epochs", "200"], config.pipeline_root)
    proc.send_signal(signal.SIGTERM)  # what a scheduler or `kill` sends
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("imagepipe: error: interrupted; the report shows what completed")
    assert "Traceback" not in err
    summary = run_summary.summarize(config.metadata_path)
    states = {c["component"]: c["state"] for c in summary["components"]}
    # Stopped in the Trainer (or, if training ended early, in a later component): that one is canceled.
    assert summary["status"] == "interrupted" and "canceled" in states.values() and states["Transform"] == "ran"
    report = out.strip().splitlines()[-1]
    assert report.startswith("report: ") and "Interrupted" in open(report[len("report: "):]).read()


def test_two_runs_at_once_on_one_root_take_turns(tmp_path, small_digits):
    root = str(tmp_path / "shared")
    args = ["--root", root, "--data", small_digits, "--schema", SAMPLE_SCHEMA, "--epochs", "2",
            "--accuracy-threshold", "0", "--no-cache", "--progress", "json"]
    first = subprocess.Popen([IMAGEPIPE, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    second = subprocess.Popen([IMAGEPIPE, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [proc.communicate(timeout=600) + (proc.returncode,) for proc in (first, second)]
    finished = []
    for out, err, code in results:
        assert code == 0, err[-2000:]
        finished.append(next(json.loads(line) for line in out.splitlines() if '"run_finished"' in line))
    assert "another run of this pipeline is in progress (pid" in results[1][1]  # the later one waited
    assert finished[0]["run_id"] != finished[1]["run_id"]
    assert all(os.path.exists(f["report"]) for f in finished) and finished[0]["report"] != finished[1]["report"]
    # Each run's summary is its own: its accuracy is what ML Metadata holds for that run id.
    listed = {r["run_id"]: r for r in run_summary.list_runs(PipelineConfig(root=root, data=small_digits).metadata_path)}
    for f in finished:
        evaluator = next(c for c in f["components"] if c["component"] == "Evaluator")
        assert listed[f["run_id"]]["status"] == "complete"
        assert listed[f["run_id"]]["accuracy"] == evaluator["details"]["accuracy"]
