"""The run report, live progress and run history, from real runs; the report checked in real Chromium."""

import json
import os

import pytest
from browser import open_page
from commands import run_imagepipe

import stacks

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)

ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")
SECTIONS = ["summary", "data", "validation", "health", "training", "evaluation", "timings"]
CHECK_JS = """(() => ({
  sections: [...document.querySelectorAll('section')].map(s => s.id),
  images: [...document.images].map(i => i.complete && i.naturalWidth > 0),
  charts: document.querySelectorAll('svg').length,
  text: document.body.innerText}))()"""


@pytest.fixture(scope="module")
def runs(cli_runs):
    """A complete run with JSON progress and, in the same root, a run the validation gate stops."""
    assert cli_runs["json"].returncode == 0, cli_runs["json"].stderr[-3000:]
    return cli_runs["root"], cli_runs["events"], cli_runs["failed"]


def test_json_progress_reports_components_ingestion_and_training(runs):
    _, events, _ = runs
    # What the run reads and where it writes comes first, before TensorFlow loads (the human lines' facts).
    assert events[0]["event"] == "run_prepared" and (events[0]["files"], events[0]["classes"]) == (300, 10)
    assert events[0]["layout"] == "folders" and events[0]["metadata"].endswith("metadata.db")
    assert events[0]["stack"] == stacks.describe()
    finished = [e["component"] for e in events if e["event"] == "component_finished"]
    assert finished[0] == "ImageExampleGen" and finished[-1] == "Pusher" and len(finished) == 13
    assert {e["component"] for e in events if e["event"] == "component_started"} >= {"ImageExampleGen", "Trainer"}
    ingest = [e for e in events if e["event"] == "progress" and e["kind"] == "ingest"]
    assert ingest and ingest[-1]["done"] == ingest[-1]["total"] == 300
    train = [e for e in events if e["event"] == "progress" and e["kind"] == "train"]
    assert [e["done"] for e in train] == list(range(1, len(train) + 1)) and train[0]["total"] == 3
    assert all(0 <= e["val_accuracy"] <= 1 for e in train)
    last = events[-1]
    assert last["event"] == "run_finished" and last["status"] == "complete" and os.path.exists(last["report"])
    times = [e["time"] for e in events]
    assert times == sorted(times)


def test_report_renders_in_a_real_browser(runs):
    _, events, _ = runs
    report = events[-1]["report"]
    seen = open_page("file://" + report, CHECK_JS, os.path.join(ARTIFACTS, "report-complete.png"))
    assert seen["errors"] == []
    assert all(url.startswith(("file://", "data:")) for url in seen["requests"])  # nothing from the network
    check = seen["check"]
    assert check["sections"] == SECTIONS
    assert check["images"] and all(check["images"])  # thumbnails of misclassified images all load
    assert check["charts"] >= 3  # loss, accuracy, confusion matrix
    text = check["text"]
    for expected in (
        "300 files → 300 examples, 0 quarantined; no anomalies",
        "BLESSED:",
        "Per class",
        "Confusion matrix",
        "Misclassified eval images",
        "loss per epoch",
        "Hyperparameters",
        "Schema in use: curated (ImportSchemaGen)",
        "pipeline_run",
        "still improving at the last epoch: raise --epochs",
    ):
        assert expected in text, expected
    assert os.path.getsize(seen["screenshot"]) > 50_000


def test_the_misclassified_eval_images_are_the_exported_models_first_mistakes(runs):
    """The Evaluator records the first misclassified eval images in the pass that picks the explanations' sample: the
    serving model's own mistakes, in record order, each with its thumbnail; the report and the review page show that
    record (the report runs no model)."""
    import glob

    import tensorflow as tf
    from conftest import model_dir
    from PIL import Image

    from components.evaluator import misclassified
    from images import feature_keys as keys
    from review import items

    _, events, _ = runs
    summary = events[-1]
    components = {c["component"]: c for c in summary["components"]}
    listed = components["Evaluator"]["details"]["misclassified"]
    serving = tf.saved_model.load(os.path.join(model_dir(summary), "Format-Serving")).signatures["serving_examples"]
    examples = components["ImageExampleGen"]["outputs"]["examples"][0]
    files = sorted(glob.glob(os.path.join(examples, "Split-eval", "*.gz")))
    records = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    out = serving(examples=tf.constant(records))
    parsed = tf.io.parse_example(
        records, {k: tf.io.FixedLenFeature([], tf.string) for k in (keys.LABEL_TEXT, keys.FILENAME)}
    )
    wrong = [
        (path.decode(), actual.decode(), predicted.decode(), float(probability))
        for path, actual, predicted, probability in zip(
            parsed[keys.FILENAME].numpy(),
            parsed[keys.LABEL_TEXT].numpy(),
            out["predicted_class"].numpy(),
            out["predicted_probability"].numpy(),
        )
        if predicted != actual
    ]
    assert 0 < len(wrong) < misclassified.MOST  # 3 epochs on 300 digits: some wrong, all of them listed
    assert listed["examined"] == len(records) == 60 and listed["most"] == misclassified.MOST
    assert [(i["path"], i["actual"], i["predicted"]) for i in listed["images"]] == [w[:3] for w in wrong]
    for image, (*_, probability) in zip(listed["images"], wrong):
        assert image["probability"] == pytest.approx(probability, rel=1e-4)
        with Image.open(os.path.join(listed["folder"], image["thumbnail"])) as thumbnail:
            assert thumbnail.format == "PNG" and max(thumbnail.size) <= misclassified.THUMBNAIL_SIZE
    text = open(summary["report"], encoding="utf-8").read()
    assert f"the first {len(wrong)} of the 60 eval images checked" in text
    assert text.count("data:image/png;base64,") >= len(wrong)
    reviewed = [i for i in items.from_run(summary).items if items.MISCLASSIFIED in i["kinds"]]
    assert sorted(i["path"] for i in reviewed) == sorted(w[0] for w in wrong)


def test_failed_run_gets_a_report_of_what_completed(runs):
    root, _, failed = runs
    assert failed.returncode == 1
    assert "data validation found" in failed.stderr and "letter-x" in failed.stderr
    report = failed.stdout.strip().splitlines()[-1].removeprefix("report: ")
    seen = open_page("file://" + report, CHECK_JS, os.path.join(ARTIFACTS, "report-failed.png"))
    assert seen["errors"] == [] and seen["check"]["sections"] == SECTIONS
    text = seen["check"]["text"]
    assert "Failed at DataValidationGate" in text and "letter-x" in text
    assert "validation stopped the run" in text and "The validation gate stopped the run" in text
    assert "Trainer did not run in this run." in text


def test_run_history_newest_first_with_failures(runs):
    root, _, _ = runs
    listed = json.loads(run_imagepipe("runs", "--root", root, "--json").stdout)
    assert [r["status"] for r in listed] == ["failed", "complete", "complete"]
    failed, complete, _ = listed
    assert failed["failed_component"] == "DataValidationGate" and "letter-x" in failed["error"]
    assert complete["blessed"] is True and 0 < complete["accuracy"] <= 1
    assert {c["state"] for c in complete["components"]} == {"ran"}
    text = run_imagepipe("runs", "--root", root, "--failed").stdout
    assert "failed at DataValidationGate: DataValidationError: data validation found" in text
    assert complete["run_id"] not in text


def test_report_and_history_bad_input_is_one_line(runs, tmp_path):
    root, _, _ = runs
    missing = run_imagepipe("report", "no-such-run", "--root", root)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"imagepipe: error: run 'no-such-run' not found in any pipeline under {root}; "
        f"'imagepipe runs --root {root}' lists them"
    ]
    empty = run_imagepipe("runs", "--root", str(tmp_path))
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1
    assert "no ML Metadata at" in empty.stderr


def test_the_report_shows_the_tflite_exports_or_why_there_are_none():
    from report.model_sections import _on_device

    html = _on_device(
        {
            "examples": 387,
            "savedmodel_accuracy": 0.98,
            "models": {"float16": {"file": "tflite/model_float16.tflite", "accuracy": 0.9791, "bytes": 70000}},
        }
    )
    assert "On-device (TFLite)" in html and "0.9791" in html and "tflite/model_float16.tflite" in html
    assert "Export failed: exit status 134: LLVM ERROR" in _on_device({"error": "exit status 134: LLVM ERROR"})
    assert _on_device(None) == ""


def test_a_thousand_classes_draw_the_most_confused_ones_not_a_million_cells():
    from report.model_sections import MAX_CONFUSION_CLASSES, _confusion

    names = [f"class-{i:04d}" for i in range(1000)]
    confusion = [[i, i, 3] for i in range(1000)] + [[5, 7, 2], [7, 5, 1], [9, 9, 0], [11, 12, 1]]
    html = _confusion(names, confusion) + _confusion(names, confusion, shares=True)
    assert len(html) < 400_000 and html.count("<rect") <= 2 * MAX_CONFUSION_CLASSES**2
    assert "1,000 classes: the 4 classes in the most confusions are drawn" in html
    assert '<td>class-0005</td><td>class-0007</td><td class="n">2</td>' in html  # the most confused pair first
    # shares are of each class's own images, not of the drawn columns: class-0005's recall 3 / 5
    assert ">.60</text>" in html
