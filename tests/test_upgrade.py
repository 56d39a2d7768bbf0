"""A root made by an earlier version keeps working (on the modern stack: made by the legacy stack, as a team upgrading
both would have it): after the move to a folder per stage (components/ regrouped by
stage, artifact modules under storage/), and after every setting was declared once (issue 53: the Tuner's parameters
and the gate's defaults renamed or changed, the local run given one owner). Its run history is listed and summarised,
the next run compares with its blessed model, warm-starts from it and measures drift against its data. Each earlier
version runs for real, from this clone's git history, in a process of its own."""

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
from commands import run_imagepipe
from conftest import model_dir

import stacks
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


def _second_run(root: str, data: str, **settings) -> PipelineConfig:
    """The next run on the earlier root: its first run's settings, warm-started from its blessed model."""
    given = {"epochs": 3, "accuracy_threshold": 0.2, "min_class_recall": 0.0, "warm_start": True, **settings}
    given.setdefault("explanations", 0)  # as its first run's: nothing here reads them
    return PipelineConfig(root=root, data=data, schema=SAMPLE_SCHEMA, **given)


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
        "--explanations",
        "0",  # nothing here reads them (1-2 s a run)
    ]
    # The earlier version's modules ahead of this tree's (the console script is the same entry point), on the stack
    # it was written for: the legacy one (a team upgrading both at once, on the modern stack).
    env = {**os.environ, "PYTHONPATH": earlier}
    script = IMAGEPIPE if stacks.NAME == "legacy" else _legacy_imagepipe()
    if stacks.NAME == "modern":
        env = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
    first = subprocess.run(
        [script, "run", *settings, "--progress", "quiet"],
        cwd=earlier,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    config = _second_run(root, small_digits)
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


def _legacy_imagepipe() -> str:
    """The legacy stack's console script beside this (modern) one: the checkout's .venv when it is a Python 3.10
    venv (`make install STACK=legacy`; stacks/in_root.sh makes its Python visible in the Debian 13 root). Skipped
    where there is none, unless IMAGEPIPE_REQUIRE_LEGACY_STACK is set (.ci/run sets it: both stacks are there)."""
    script = os.path.join(PROJECT_DIR, ".venv", "bin", "imagepipe")
    python = os.path.join(PROJECT_DIR, ".venv", "bin", "python")
    found = (
        os.path.exists(script)
        and subprocess.run(
            [python, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 10))"], capture_output=True
        ).returncode
        == 0
    )
    if not found:
        if os.environ.get("IMAGEPIPE_REQUIRE_LEGACY_STACK"):
            pytest.fail(f"no legacy stack at {script}: run `make install STACK=legacy` first")
        pytest.skip(f"no legacy stack at {script} (`make install STACK=legacy`)")
    return script


def _legacy(*args: str, cwd: str):
    """A legacy-stack command: its own interpreter and site-packages, this checkout's code."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([_legacy_imagepipe(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(stacks.NAME != "modern", reason="the legacy stack's root, taken up by the modern stack")
def test_a_root_made_by_the_legacy_stack_keeps_working_on_the_modern_one(tmp_path, small_digits):
    """A team upgrading from TFX 1.16: the root, ML Metadata store, features cache and pushed model the legacy stack
    made, taken up by the modern stack's run (history, baseline, warm start, cached features), and each stack's
    pushed model served by the other's `imagepipe predict`."""
    root = str(tmp_path / "root")
    settings = ["--root", root, "--data", small_digits, "--schema", SAMPLE_SCHEMA, "--epochs", "3"]
    # Lite0 at 32 px for 3 epochs learns the digits little (eval accuracy ~0.2): any accuracy blesses, so that each
    # stack pushes a model (what is tested is the upgrade, not the model)
    settings += ["--accuracy-threshold", "0", "--min-class-recall", "0", "--model", "efficientnet_lite0"]
    settings += ["--image-size", "32"]  # the pretrained backbone: its features step and cache too
    settings += ["--explanations", "0"]  # as _second_run's: nothing here reads them
    first = _legacy("run", *settings, "--progress", "quiet", cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    config = _second_run(root, small_digits, model="efficientnet_lite0", image_size=32, accuracy_threshold=0.0)
    [legacy_run] = run_summary.list_runs(config.metadata_path)
    assert legacy_run["status"] == "complete" and legacy_run["blessed"], legacy_run
    before = run_summary.summarize(config.metadata_path, legacy_run["run_id"])
    legacy_model = _details(before, "Pusher")["destination"]

    second = local_runner.run(config)

    runs = run_summary.list_runs(config.metadata_path)
    assert [r["run_id"] for r in runs][1:] == [legacy_run["run_id"]] and runs[0]["status"] == "complete"
    assert _details(before, "ImageExampleGen")["files_seen"] == 300 and _details(before, "Pusher")["pushed"]
    assert _details(second, "Evaluator")["baseline_accuracy"] is not None
    assert _details(second, "Trainer")["warm_started_from"] == os.path.join(model_dir(before), "keras")
    features = _details(second, "BackboneFeatures")
    assert features["images"] == 300 and features["reused"] + features["computed"] == 300, features
    modern_model = _details(second, "Pusher")["destination"]
    assert _details(second, "Pusher")["pushed"] and modern_model != legacy_model

    # Each stack serves the other's pushed model: the same labels for the same images.
    images = os.path.join(small_digits, "3")
    labels = {}
    for stack, model in (("legacy", legacy_model), ("modern", modern_model)):
        for server in ("legacy", "modern"):
            out = str(tmp_path / f"{stack}-by-{server}.jsonl")
            args = ("predict", "--model", model, "--top", "10", "--output", out, images)
            done = _legacy(*args, cwd=str(tmp_path)) if server == "legacy" else run_imagepipe(*args, timeout=300)
            assert done.returncode == 0, f"{stack}'s model by {server}: {done.stderr[-2000:]}"
            rows = [json.loads(line) for line in open(out)]
            assert len(rows) == len(os.listdir(images)) and not any("error" in r for r in rows)
            labels[stack, server] = {r["path"]: r["predictions"] for r in rows}
    for stack in ("legacy", "modern"):
        _same_predictions(labels[stack, "legacy"], labels[stack, "modern"])


def _same_predictions(one, other):
    """The same class for every image (but a near tie), its probability within 0.01: TensorFlow 2.16 and 2.21 differ
    in float rounding only."""
    assert one.keys() == other.keys()
    for path, predictions in one.items():
        theirs = {p["class"]: p["probability"] for p in other[path]}
        best, second = predictions[0], (predictions[1:] or [{"probability": 0.0}])[0]
        assert abs(theirs[best["class"]] - best["probability"]) <= 0.01, (path, predictions, other[path])
        if best["probability"] - second["probability"] > 0.02:
            assert other[path][0]["class"] == best["class"], (path, predictions, other[path])
