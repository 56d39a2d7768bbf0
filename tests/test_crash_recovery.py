"""Runs that do not end normally, on one root: stopped with SIGTERM (recorded as interrupted, with a
report), then killed with SIGKILL during training, then started again (it completes without redoing
finished work or consuming a half-written model); and two runs started at once on one root (they
take turns; each gets its own results, and the same data and seed give the same model)."""

import glob
import json
import os
import signal
import time

import pytest
from commands import StartedCommand, run_imagepipe
from conftest import model_weights
from ml_metadata.proto import metadata_store_pb2

from pipeline import local_runner
from pipeline.config import SAMPLE_SCHEMA, PipelineConfig
from runs import run_lock, run_store, run_summary

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)


def _start_and_wait_for_training(root, data, epochs=200):
    """Starts `imagepipe run` and returns once its Trainer has finished a first epoch (its JSON progress
    says so); 200 epochs, so the run is still training when the test stops it."""
    proc = StartedCommand(
        [
            "run",
            "--root",
            root,
            "--data",
            data,
            "--schema",
            SAMPLE_SCHEMA,
            "--epochs",
            str(epochs),
            "--progress",
            "json",
        ]
    )
    for line in proc.lines(timeout=600):
        if line.startswith("{") and json.loads(line).get("kind") == "train":
            return proc
    pytest.fail("the run ended before training: " + proc.wait().stderr[-2000:])


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, small_digits):
    """A run stopped with SIGTERM (what a scheduler or `kill` sends) while training."""
    config = PipelineConfig(
        root=str(tmp_path_factory.mktemp("stopped")), data=small_digits, schema=SAMPLE_SCHEMA, epochs=2
    )
    proc = _start_and_wait_for_training(config.root, small_digits)
    proc.send_signal(signal.SIGTERM)
    done = proc.wait(timeout=300)
    return config, done.returncode, done.stdout, done.stderr


def test_stopped_run_is_recorded_as_interrupted_with_a_report(stopped):
    config, code, out, err = stopped
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("imagepipe: error: interrupted; the report shows what completed")
    assert "Traceback" not in err
    summary = run_summary.summarize(config.metadata_path)
    states = {c["component"]: c["state"] for c in summary["components"]}
    assert summary["status"] == "interrupted" and states["Trainer"] == "canceled" and states["Transform"] == "ran"
    finished = json.loads(out.strip().splitlines()[-1])
    assert finished["event"] == "run_finished" and finished["status"] == "interrupted"
    assert "Interrupted" in open(finished["report"]).read()


def test_killed_trainer_then_rerun(stopped):
    """After the stopped run, a run killed with SIGKILL while training (the OOM killer, a lost machine),
    then a run that completes: each reuses what finished before it, and only the last Trainer's model
    is published and evaluated."""
    config, _, _, _ = stopped
    proc = _start_and_wait_for_training(config.root, config.data)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole process group
    assert proc.wait().returncode == -signal.SIGKILL
    assert len(glob.glob(os.path.join(config.pipeline_root, "Trainer", "model_run", "*", "*"))) >= 2  # half-written
    killed = run_summary.summarize(config.metadata_path)
    states = {c["component"]: c["state"] for c in killed["components"]}
    assert states["Trainer"] == "running" and "Evaluator" not in states
    assert states["Transform"] == "cached"  # as the stopped run's message promised
    assert killed["status"] == "interrupted"  # nobody holds the pipeline's lock any more
    listed = run_summary.list_runs(config.metadata_path)[0]
    assert listed["status"] == "interrupted"
    # `runs` showed "1 running" for the dead Trainer, and a duration that ended when it started.
    trainer = next(c for c in listed["components"] if c["component"] == "Trainer")
    assert trainer["state"] == "interrupted" and "running" not in {c["state"] for c in listed["components"]}
    trainer_started = next(c for c in killed["components"] if c["component"] == "Trainer")["started_ms"]
    assert listed["started_ms"] + 1000 * listed["seconds"] > trainer_started + 500  # it trained an epoch

    # 2 epochs this time: a training setting, so everything before the Trainer comes from the cache.
    rerun = local_runner.run(config)
    states = {c["component"]: c["state"] for c in rerun["components"]}
    for finished in (
        "ImageExampleGen",
        "StatisticsGen",
        "ImportSchemaGen",
        "ExampleValidator",
        "DataValidationGate",
        "Transform",
    ):
        assert states[finished] == "cached", finished
    assert states["Trainer"] == states["Evaluator"] == "ran"

    # Only the new Trainer's model was published, and that is what the Evaluator read.
    store = run_store.open_store(config.metadata_path)
    models = [a for a in store.get_artifacts_by_type("Model") if a.state == metadata_store_pb2.Artifact.LIVE]
    new_trainer = next(c for c in rerun["components"] if c["component"] == "Trainer")
    assert [m.uri for m in models] == new_trainer["outputs"]["model"]
    evaluator = next(c for c in rerun["components"] if c["component"] == "Evaluator")
    inputs = [
        e
        for e in store.get_events_by_execution_ids([evaluator["execution_id"]])
        if e.type == metadata_store_pb2.Event.INPUT
    ]
    read = {a.uri for a in store.get_artifacts_by_id([e.artifact_id for e in inputs])}
    assert new_trainer["outputs"]["model"][0] in read


def test_two_runs_at_once_on_one_root_take_turns(cli_runs):
    first, second = cli_runs["json"], cli_runs["text"]  # the second started while the first held the lock
    assert first.returncode == second.returncode == 0, (first.stderr[-2000:], second.stderr[-2000:])
    assert "imagepipe: another run of this pipeline is in progress (pid" in second.stdout  # it said why it waits
    finished = cli_runs["events"][-1]
    assert finished["event"] == "run_finished" and finished["status"] == "complete"
    second_report = second.stdout.strip().splitlines()[-1].removeprefix("report: ")
    assert os.path.exists(finished["report"]) and os.path.exists(second_report)
    assert second_report != finished["report"]
    listed = run_summary.list_runs(cli_runs["metadata_path"])
    assert [r["status"] for r in listed] == ["complete", "complete"]
    # Each run's results are its own: the first's accuracy is what ML Metadata holds for its run id, and
    # the second's report is of the other run.
    by_id = {r["run_id"]: r for r in listed}
    evaluator = next(c for c in finished["components"] if c["component"] == "Evaluator")
    assert by_id[finished["run_id"]]["accuracy"] == evaluator["details"]["accuracy"]
    (other,) = set(by_id) - {finished["run_id"]}
    assert other in open(second_report).read()
    # The same data, settings and seed, trained from scratch twice (--no-cache): one model, bit for bit.
    assert by_id[other]["accuracy"] == by_id[finished["run_id"]]["accuracy"]
    first_weights, second_weights = (
        model_weights(run_summary.summarize(cli_runs["metadata_path"], run_id))
        for run_id in (finished["run_id"], other)
    )
    assert len(first_weights) == len(second_weights) > 0
    assert all((a == b).all() for a, b in zip(first_weights, second_weights))


def test_sigterm_during_ingestion_is_recorded_as_interrupted(tmp_path, small_digits):
    """Beam re-raises the KeyboardInterrupt that SIGTERM raises as its own RuntimeError: the run was listed
    as failed with "RuntimeError: KeyboardInterrupt"."""
    import shutil

    from PIL import Image

    data = tmp_path / "data"
    shutil.copytree(small_digits, data)
    # large flat PNGs: small files, slow to decode, spread over the batches (compressed least: quicker to write)
    for n in range(30):
        Image.new("L", (5000, 5000), n * 8).save(data / str(n % 10) / f"big-{n}.png", compress_level=1)
    proc = StartedCommand(["run", "--root", str(tmp_path / "root"), "--data", str(data), "--progress", "json"])
    for line in proc.lines(timeout=300):
        if line.startswith("{") and json.loads(line).get("kind") == "ingest":  # a first batch is done
            proc.send_signal(signal.SIGTERM)
            break
    done = proc.wait(timeout=300)
    assert done.returncode == 130, done.stderr[-2000:]
    (listed,) = json.loads(run_imagepipe("runs", "--root", str(tmp_path / "root"), "--json").stdout)
    assert listed["status"] == "interrupted" and listed["error"] == "", listed
    assert [c["state"] for c in listed["components"]] == ["canceled"]
    text = run_imagepipe("runs", "--root", str(tmp_path / "root")).stdout
    header, row = text.splitlines()[:2]
    assert row[header.index("components") :].startswith("1 canceled")  # the status fits its column


def test_ctrl_c_while_waiting_for_its_turn_ends_the_run_and_its_json_progress(tmp_path, small_digits):
    """A run waiting for another run of its pipeline (runs/run_lock.py) and stopped there: nothing ran, the exit
    status is Ctrl-C's, and --progress json still ends with run_finished (scripts wait for it)."""
    root = str(tmp_path / "root")
    metadata_path = PipelineConfig(root=root, data=small_digits).metadata_path
    with run_lock.hold(metadata_path):  # another run of the pipeline has its turn
        proc = StartedCommand(["run", "--root", root, "--data", small_digits, "--progress", "json"])
        for line in proc.lines(timeout=300):
            if line.startswith("{") and json.loads(line)["event"] == "run_prepared":
                break
        time.sleep(2)  # from run_prepared to waiting on the lock is a few lines of Python
        proc.send_signal(signal.SIGINT)
        done = proc.wait(timeout=300)
    assert done.returncode == 130, done.stderr[-2000:]
    assert "another run of this pipeline is in progress" in done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events] == ["run_prepared", "run_finished"], events
    assert events[-1]["error"].startswith("interrupted") and events[-1]["report"] is None
    assert not os.path.exists(metadata_path)  # nothing ran: no store was made


def test_a_command_forked_from_a_warm_interpreter_stops_on_ctrl_c_as_one_a_shell_starts(tmp_path):
    """Test infrastructure (tests/warm_interpreter.py): an interpreter started while its test process ignored
    SIGINT inherits that, as processes do; the commands it forks still get Ctrl-C as a shell gives it."""
    from warm_interpreter import WarmInterpreter

    (tmp_path / "signals_seen.py").write_text(
        "import signal\n"
        "blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.SIGINT in blocked)\n"
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        warm = WarmInterpreter(["json"])
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        log = str(tmp_path / "command")
        assert warm.run_module("signals_seen", [], log, cwd=str(tmp_path), timeout=60) == 0
        assert open(log + ".stdout").read().split() == ["True", "False"]
    finally:
        warm.close()
