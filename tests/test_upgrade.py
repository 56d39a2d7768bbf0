"""A root made by an earlier version keeps working: after the move to a folder per stage (components/ regrouped by
stage, artifact modules under storage/), and after every setting was declared once (issue 53: the Tuner's parameters
and the gate's defaults renamed or changed, the local run given one owner). Its run history is listed and summarised,
the next run compares with its blessed model, warm-starts from it and measures drift against its data. Each earlier
version runs for real, from this clone's git history, in a process of its own."""

import io
import os
import subprocess
import sys
import tarfile

import pytest
from conftest import model_dir

from pipeline import local_runner
from pipeline.config import PROJECT_DIR, SAMPLE_SCHEMA, PipelineConfig
from runs import run_summary

pytestmark = pytest.mark.slow  # two whole pipeline runs for each earlier version

# The last commits before each change of layout (docs/layout.md: Moving from an earlier layout).
EARLIER_VERSIONS = {
    "before-the-move": "6c9dea2e7f5183009c69fda13748a3f68db221a4",
    "before-the-declarations": "43b5de9dd4acab4a01e18456ecdf7da0150bf853",
}
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


def _earlier_version(folder, commit: str) -> str:
    shallow = subprocess.run(
        ["git", "-C", PROJECT_DIR, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    ).stdout.strip()
    if shallow == "true":  # a clone made with --depth has no earlier version to run; a full clone must have it
        pytest.skip(f"a shallow clone: the earlier code ({commit[:7]}) is not here to run")
    archive = subprocess.run(["git", "-C", PROJECT_DIR, "archive", commit], capture_output=True)
    assert archive.returncode == 0, (
        f"the earlier code ({commit[:7]}) is not in this clone's "
        f"history: clone without --depth ({archive.stderr.decode()[-300:]})"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder)
    return str(folder)


def _details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


@pytest.mark.parametrize("commit", EARLIER_VERSIONS.values(), ids=EARLIER_VERSIONS.keys())
def test_a_root_made_by_an_earlier_version_keeps_its_history_baseline_and_warm_start(tmp_path, small_digits, commit):
    earlier = _earlier_version(tmp_path / "earlier", commit)
    root = str(tmp_path / "root")
    settings = [
        "--root",
        root,
        "--data",
        small_digits,
        "--schema",
        SAMPLE_SCHEMA,
        "--epochs",
        "3",
        "--accuracy-threshold",
        "0.2",
        "--min-class-recall",
        "0",
    ]
    # The earlier version's modules ahead of this tree's (the console script is the same entry point).
    env = {**os.environ, "PYTHONPATH": earlier}
    first = subprocess.run(
        [IMAGEPIPE, "run", *settings, "--progress", "quiet"],
        cwd=earlier,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    config = PipelineConfig(
        root=root,
        data=small_digits,
        schema=SAMPLE_SCHEMA,
        epochs=3,
        accuracy_threshold=0.2,
        min_class_recall=0.0,
        warm_start=True,
    )
    [earlier_run] = run_summary.list_runs(config.metadata_path)
    assert earlier_run["status"] == "complete" and earlier_run["blessed"], earlier_run

    second = local_runner.run(config)

    # The history: both runs listed, the earlier one summarised by this code as it was recorded.
    runs = run_summary.list_runs(config.metadata_path)
    assert [r["run_id"] for r in runs][1:] == [earlier_run["run_id"]] and runs[0]["status"] == "complete"
    before = run_summary.summarize(config.metadata_path, earlier_run["run_id"])
    assert _details(before, "ImageExampleGen")["files_seen"] == 300
    assert _details(before, "Evaluator")["blessed"] and _details(before, "Pusher")["pushed"]
    # The baseline: the Evaluator compared with the earlier blessed model, the Trainer started from its weights,
    # and the gate measured drift against the data it was judged on.
    assert _details(second, "Evaluator")["baseline_accuracy"] is not None
    assert _details(second, "Trainer")["warm_started_from"] == os.path.join(model_dir(before), "keras")
    drift = _details(second, "DataValidationGate")["drift"]
    assert "skipped" not in drift and drift["checks"], drift
