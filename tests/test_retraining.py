"""Retraining on new data drops, locally: each run reads the latest span (with a rolling window),
warm-starts from the last blessed model, is compared with it, and is pushed only when not worse."""

import dataclasses
import json
import os
import random
import shutil

import pytest
from conftest import model_dir

from pipeline import local_runner
from pipeline.config import SAMPLE_SCHEMA, PipelineConfig

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)


def _details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


def _states(summary):
    return {c["component"]: c["state"] for c in summary["components"]}


def _copy_digits(source, target, start, count):
    """Files [start, start+count) of each digit folder."""
    for label in sorted(os.listdir(source)):
        if label.startswith("."):
            continue
        os.makedirs(os.path.join(target, label), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(source, label)))[start : start + count]:
            shutil.copy2(os.path.join(source, label, name), os.path.join(target, label, name))


def test_spans_window_warm_start_and_push_only_when_not_worse_and_each_dataset_is_its_own_pipeline(
    tmp_path, digits_dir, capsys
):
    drops = tmp_path / "drops"
    config = PipelineConfig(
        root=str(tmp_path / "out"),
        data=str(drops),
        span_pattern="span-{SPAN}",
        span_window=2,
        schema=SAMPLE_SCHEMA,
        image_size=32,
        warm_start=True,
        accuracy_threshold=0.5,
        epochs=12,
        explanations=0,  # nothing here reads them (the Evaluator's misclassified images are still recorded)
    )
    _copy_digits(digits_dir, drops / "span-1", 0, 40)
    first = local_runner.run(config)
    assert _details(first, "ImageExampleGen")["files_seen"] == 400
    assert _details(first, "Evaluator")["blessed"] and _details(first, "Pusher")["pushed"]
    _each_dataset_is_its_own_pipeline(config.root, tmp_path, digits_dir, first, capsys)

    # A new drop: the window reads spans 1 and 2; training starts from the blessed model (not the other
    # dataset's, pushed in between).
    _copy_digits(digits_dir, drops / "span-2", 40, 40)
    second = local_runner.run(config)
    ingest = _details(second, "ImageExampleGen")
    assert ingest["files_seen"] == 800 and ingest["source"].endswith("spans 1, 2")
    # Warm start: from the first run's (blessed) weights, so the first epoch already scores about what
    # the first model ended at, far above where the first run's own first epoch started.
    first_log, trainer_log = (_training_log(s) for s in (first, second))
    assert trainer_log["warm_started_from"] == os.path.join(model_dir(first), "keras")
    started = trainer_log["epochs"][0]["val_sparse_categorical_accuracy"]
    assert started >= _details(first, "Evaluator")["accuracy"] - 0.15
    assert started > first_log["epochs"][0]["val_sparse_categorical_accuracy"] + 0.1
    evaluation = _details(second, "Evaluator")
    assert evaluation["baseline_accuracy"] is not None  # compared with the first blessed model
    assert evaluation["blessed"] == (evaluation["accuracy"] >= evaluation["baseline_accuracy"])
    assert _details(second, "Pusher")["pushed"] == evaluation["blessed"]
    pushed_before = sorted(os.listdir(config.serving_dir))

    # A bad drop: training labels shuffled (eval kept clean, pre-split). The candidate is worse
    # than the last blessed model, so it is not blessed and nothing is pushed.
    bad = drops / "span-3"
    _copy_digits(digits_dir, bad / "eval", 80, 15)
    _copy_digits(digits_dir, bad / "train", 95, 60)
    files = sorted(str(p) for p in (bad / "train").rglob("*.*"))
    labels = [os.path.basename(os.path.dirname(p)) for p in files]
    random.Random(0).shuffle(labels)
    for n, (path, label) in enumerate(zip(files, labels)):
        os.replace(path, bad / "train" / label / f"moved-{n}-{os.path.basename(path)}")
    config = PipelineConfig(**{**config.__dict__, "span_window": 1, "warm_start": False})
    third = local_runner.run(config)
    assert _details(third, "ImageExampleGen")["source"].endswith("span-3")
    evaluation = _details(third, "Evaluator")
    assert not evaluation["blessed"] and evaluation["accuracy"] < evaluation["baseline_accuracy"]
    assert (
        f"accuracy {evaluation['accuracy']:.4f} is below the last blessed model's {evaluation['baseline_accuracy']:.4f}"
    ) in evaluation["failures"]
    assert not _details(third, "Pusher")["pushed"]
    assert sorted(os.listdir(config.serving_dir)) == pushed_before
    assert _states(third)["Trainer"] == "ran"


def _each_dataset_is_its_own_pipeline(root, tmp_path, digits_dir, first, capsys):
    """Another dataset in the same root as a first run of 10 classes: two lineages."""
    from cli.main import main as cli_main

    pets = tmp_path / "PetImages"
    _copy_classes(digits_dir, pets, ["0", "1"], count=60)  # two classes, as cats and dogs would be
    second = local_runner.run(
        PipelineConfig(root=root, data=str(pets), epochs=8, image_size=32, accuracy_threshold=0.3, explanations=0)
    )
    # Two lineages: the 2-class model is not compared with the 10-class one (that crashed TFMA).
    for summary, classes in ((first, 10), (second, 2)):
        assert len(_details(summary, "Trainer")["class_names"]) == classes
        evaluation = _details(summary, "Evaluator")
        assert evaluation["blessed"] and evaluation["baseline_accuracy"] is None, evaluation
        assert not evaluation["baseline_skipped"] and _details(summary, "Pusher")["pushed"]
    names = sorted(os.listdir(os.path.join(root, "serving")))
    assert len(names) == 2 and names[0].startswith("drops-") and names[1].startswith("petimages-")

    assert cli_main(["runs", "--root", root, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["pipeline"] for r in listed) == names and all(r["blessed"] for r in listed)
    assert cli_main(["predict", "--root", root, str(pets / "0" / os.listdir(pets / "0")[0])]) == 2
    assert "2 pipelines in" in capsys.readouterr().err  # which model to use is the user's choice

    # One seed gives one model: test_crash_recovery.py::test_two_runs_at_once_on_one_root_take_turns.


def _copy_classes(source, target, classes, start=0, count=40, resize=None):
    """Files [start, start+count) of the given class folders, optionally resized (a new camera)."""
    from PIL import Image

    for label in classes:
        os.makedirs(os.path.join(target, label), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(source, label)))[start : start + count]:
            src, dst = os.path.join(source, label, name), os.path.join(target, label, name)
            if resize:
                Image.open(src).resize((resize, resize)).save(dst)
            else:
                shutil.copy2(src, dst)


def _training_log(summary):
    return json.load(open(os.path.join(_details(summary, "Trainer")["model_run"], "training.json")))


def test_class_changes_are_reported_and_drift_stops_the_run_unless_warned(tmp_path, digits_dir):
    from components.validation.gate import DataValidationError
    from report import report
    from runs import run_summary, run_text

    drops = tmp_path / "drops"
    config = PipelineConfig(
        root=str(tmp_path / "out"),
        data=str(drops),
        span_pattern="span-{SPAN}",
        epochs=8,
        image_size=32,
        explanations=0,
        accuracy_threshold=0.3,
        warm_start=True,
    )  # SchemaGen infers
    _copy_classes(digits_dir, drops / "span-1", [str(d) for d in range(9)])
    assert _details(local_runner.run(config), "Evaluator")["blessed"]

    # Span 2 adds a class: the 9-class model is not a baseline (nor a warm start) for the 10-class one.
    _copy_classes(digits_dir, drops / "span-2", [str(d) for d in range(10)], start=40)
    second = local_runner.run(config)
    gate = _details(second, "DataValidationGate")
    assert gate["passed"] and gate["drift"]["classes_added"] == ["9"] and not gate["drift"]["classes_removed"]
    evaluation = _details(second, "Evaluator")
    assert evaluation["blessed"] and evaluation["baseline_accuracy"] is None
    assert evaluation["baseline_skipped"] == "the last blessed model was trained on other classes (added '9')"
    assert _details(second, "Trainer")["warm_start_skipped"] == "the last blessed model was trained on other classes"
    lines = "\n".join(run_text.format_summary(second))
    assert "classes added since the last blessed model: '9'" in lines and "judged on the threshold alone" in lines
    html = open(report.build(second, str(tmp_path / "second.html"))).read()
    assert "classes added since the last blessed model: &#x27;9&#x27;" in html
    assert "not compared with the last blessed model" in html

    # Span 3: the same classes and counts from a new camera (64 px instead of 32): the gate stops the run.
    _copy_classes(digits_dir, drops / "span-3", [str(d) for d in range(10)], start=80, resize=64)
    with pytest.raises(DataValidationError) as stopped:
        local_runner.run(config)
    first_line = str(stopped.value).splitlines()[0]
    assert (
        "image width drifted from the last blessed model's data (L-infinity 1.000 > 0.300)" in first_line
        and "image height drifted" in first_line
        and "--max-size-drift" in first_line
    )
    failed = run_summary.summarize(config.metadata_path)
    assert failed["status"] == "failed" and "Trainer" not in {c["component"] for c in failed["components"]}
    html = open(report.build(failed, str(tmp_path / "failed.html"))).read()  # both distributions, side by side
    assert "image width: DRIFTED (L-infinity 1.000, threshold 0.300)" in html and "&lt;=64" in html

    warned = local_runner.run(dataclasses.replace(config, gate="warn"))
    gate = _details(warned, "DataValidationGate")
    assert not gate["passed"] and {c["feature"] for c in gate["drifted"]} == {"image width", "image height"}
    assert _details(warned, "Evaluator")["baseline_accuracy"] is not None  # same classes: compared


def test_the_last_blessed_model_is_found_from_any_folder_and_a_lost_one_stops_the_run(tmp_path, small_digits):
    """A relative --root, a later run from another folder, a moved root, a deleted pipelines/ folder: a
    worse model is never blessed uncompared, and `runs` and `report` read a moved root."""
    from commands import run_imagepipe

    work = tmp_path / "work"
    work.mkdir()
    common = ["--data", small_digits, "--schema", SAMPLE_SCHEMA, "--image-size", "32", "--accuracy-threshold", "0"]
    common += ["--explanations", "0"]  # nothing here reads them

    def run(cwd, root, *extra):
        return run_imagepipe("run", "--root", str(root), *common, *extra, cwd=cwd, timeout=900)

    first = run(work, "roots/rel", "--epochs", "10")
    assert first.returncode == 0 and "BLESSED" in first.stdout, first.stderr[-2000:]
    # From another folder, the same root given absolute; a model that learnt nothing.
    worse = run(tmp_path, work / "roots" / "rel", "--epochs", "1", "--learning-rate", "1e-7")
    assert worse.returncode == 0, worse.stderr[-2000:]
    evaluator = next(line for line in worse.stdout.splitlines() if line.strip().startswith("Evaluator"))
    assert "(last blessed model: " in evaluator and "not blessed" in evaluator, worse.stdout
    assert "not pushed" in worse.stdout and "no blessed model yet" not in worse.stdout

    moved = tmp_path / "moved"
    shutil.move(str(work / "roots" / "rel"), str(moved))
    listed = json.loads(run_imagepipe("runs", "--root", str(moved), "--json", cwd=tmp_path).stdout)
    assert [(r["blessed"], r["accuracy"] is not None) for r in listed] == [(False, True), (True, True)]
    report = run_imagepipe("report", "--root", str(moved), cwd=tmp_path)
    assert report.returncode == 0 and "below the last blessed model" in open(report.stdout.strip()).read()

    shutil.rmtree(moved / "pipelines")  # the blessed model's files are gone; its record is not
    lost = run(tmp_path, moved, "--epochs", "1", "--no-cache")
    assert lost.returncode == 1
    assert (
        lost.stderr.strip()
        .splitlines()[-1]
        .startswith("imagepipe: error: the last blessed model's blessing is missing (")
    ), lost.stderr[-2000:]
    assert "Pusher" not in lost.stdout
    blessed_run = listed[-1]["run_id"]
    report = run_imagepipe("report", "--root", str(moved), blessed_run, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "outputs are no longer on disk" in open(report.stdout.strip()).read()
