"""Coming from Vertex AutoML: its import files (CSV and JSON Lines, local and in Cloud Storage), evaluation
at a confidence threshold (per class, precision-recall, a test split), AutoML's batch prediction output,
and the model card pushed with every blessed model."""

import csv
import glob
import json
import os
import shutil

import pytest
from browser import open_page
from commands import run_helper, run_imagepipe
from conftest import image_bytes, write
from fake_endpoints import FakeService

from components.evaluator import views as evaluation_views
from images.finding import sources
from images.image_check import Reason
from prediction import image_inputs, result_files

ML_USES = ["TRAINING"] * 16 + ["VALIDATION"] * 6 + ["TEST"] * 5 + ["UNASSIGNED"] * 3  # per class
SPLIT_OF = {"TRAINING": "train", "VALIDATION": "eval", "TEST": "test", "UNASSIGNED": None}
ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")


def make_import_folder(digits_dir: str, out, uri_prefix: str, uses=ML_USES) -> dict:
    """A digit a class per ML_USE of `uses` (30 by default) as an AutoML import folder: the images under
    images/, classes 0-4 in a CSV (paths relative to it, ML_USE first), 5-9 in JSON Lines (`uri_prefix` +
    path: the folder's own absolute path or gs:// URI, as Vertex writes them).
    Returns {images/<label>/<name>: (label, split or None)}."""
    rows, csv_lines, json_lines = {}, [], []
    for label in range(10):
        names = sorted(n for n in os.listdir(os.path.join(digits_dir, str(label))) if not n.startswith("."))
        for use, name in zip(uses, names):
            rel = f"images/{label}/{name}"
            shutil.copy(os.path.join(digits_dir, str(label), name), write(os.path.join(out, rel), b""))
            rows[rel] = (str(label), SPLIT_OF[use])
            if label < 5:
                csv_lines.append(f"{use},{rel},{label}")
            else:
                json_lines.append(
                    json.dumps(
                        {
                            "imageGcsUri": f"{uri_prefix}/{rel}",
                            "classificationAnnotation": {"displayName": str(label)},
                            "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": use.lower()},
                        }
                    )
                )
    write(os.path.join(out, "digits-0-4.csv"), ("\n".join(csv_lines) + "\n").encode())
    write(os.path.join(out, "digits-5-9.jsonl"), ("\n".join(json_lines) + "\n").encode())
    return rows


# --- import files, listed ------------------------------------------------------------------------------------


def test_csv_and_jsonl_rows_become_labels_and_splits(tmp_path):
    for n, name in enumerate("abcdefghi"):
        write(tmp_path / "set" / "img" / f"{name}.jpg", image_bytes(seed=n))
    write(tmp_path / "img" / "a.jpg", image_bytes(seed=9))
    write(
        tmp_path / "set" / "rows.csv",
        "\n".join(
            [
                "TRAINING,../img/a.jpg,cat",  # a path outside the import folder: an error row, never read
                "training,img/a.jpg,cat",  # ML_USE in any case
                "VALIDATION,img/b.jpg,dog,,",  # trailing empty fields, as spreadsheets write them
                "TEST,img/c.jpg,cat",
                "UNASSIGNED,img/d.jpg,dog",  # split by content hash
                "img/e.jpg,cat",  # no ML_USE: split by hash
                "HOLDOUT,img/f.jpg,dog",  # an ML_USE Vertex does not know
                "TRAINING,img/g.jpg,",  # no label
                "",
            ]
        ).encode(),
    )
    write(
        tmp_path / "set" / "more.jsonl",
        "\n".join(
            [
                json.dumps(
                    {
                        "imageGcsUri": str(tmp_path / "set" / "img" / "h.jpg"),  # absolute, as Vertex writes gs:// URIs
                        "classificationAnnotation": {"displayName": "dog"},
                        "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": "test"},
                    }
                ),
                json.dumps({"imageGcsUri": "img/i.jpg", "classificationAnnotation": {"displayName": "cat"}}),
                "{not json",
            ]
        ).encode(),
    )
    listing = sources.list_source(str(tmp_path / "set"), str(tmp_path / "set"))
    assert listing.layout == "automl"
    got = {c.rel_path: c for c in listing.candidates}
    assert {rel: (c.label, c.split) for rel, c in got.items() if not c.problem} == {
        "img/a.jpg": ("cat", "train"),
        "img/b.jpg": ("dog", "eval"),
        "img/c.jpg": ("cat", "test"),
        "img/d.jpg": ("dog", None),
        "img/e.jpg": ("cat", None),
        "img/h.jpg": ("dog", "test"),
        "img/i.jpg": ("cat", None),
    }
    problems = sorted((c.problem[0], c.problem[1].split(":")[0]) for c in listing.candidates if c.problem)
    assert problems == [
        (Reason.MISSING_LABEL, "rows.csv line 8 has no label"),
        (Reason.OUTSIDE_ROOT, "rows.csv line 1"),
        (Reason.UNKNOWN_SPLIT, "rows.csv line 7"),
        (Reason.UNREADABLE, "more.jsonl line 3"),
    ]


def test_import_files_are_told_apart_from_manifests_by_content(tmp_path):
    write(tmp_path / "photos" / "cat" / "IMG_1", image_bytes())
    write(tmp_path / "photos" / "dog" / "IMG_2", image_bytes(seed=1))
    write(tmp_path / "photos" / "manifest.csv", b"path,label\ncat/IMG_1,cat\ndog/IMG_2,dog\n")
    write(tmp_path / "photos" / "import.csv", b"cat/IMG_1,cat\ndog/IMG_2,dog\n")  # no image suffix to go by
    write(tmp_path / "photos" / "named.csv", b"gs://bucket/cat/IMG_1,cat\n")
    assert sources.detect_layout(str(tmp_path / "photos" / "manifest.csv")) == "manifest"
    assert sources.detect_layout(str(tmp_path / "photos" / "named.csv")) == "automl"
    # Class folders with a manifest beside them are still class folders, not a folder of import files.
    os.remove(tmp_path / "photos" / "import.csv")
    os.remove(tmp_path / "photos" / "named.csv")
    assert sources.detect_layout(str(tmp_path / "photos")) == "folders"
    # A headerless CSV that gives nothing to go by is read as a manifest, whose error names --layout automl;
    # forced, it is an import file.
    write(tmp_path / "photos" / "import.csv", b"cat/IMG_1,cat\ndog/IMG_2,dog\n")
    csv_file = str(tmp_path / "photos" / "import.csv")
    with pytest.raises(sources.DataError, match="--layout automl"):
        sources.list_source(str(tmp_path / "photos"), csv_file)
    forced = sources.list_source(str(tmp_path / "photos"), csv_file, layout="automl")
    assert [(c.rel_path, c.label, c.problem) for c in forced.candidates] == [
        ("cat/IMG_1", "cat", None),
        ("dog/IMG_2", "dog", None),
    ]


@pytest.mark.parametrize(
    "name,text",
    [
        ("rows.csv", "TRAINING,img/a.jpg,cat,dog\n"),
        ("rows.csv", "img/a.jpg,cat,dog\n"),
        (
            "rows.jsonl",
            json.dumps(
                {
                    "imageGcsUri": "img/a.jpg",
                    "classificationAnnotations": [{"displayName": "cat"}, {"displayName": "dog"}],
                }
            )
            + "\n",
        ),
    ],
)
def test_a_multi_label_row_is_multi_label_or_with_task_single_a_one_line_error(tmp_path, name, text):
    write(tmp_path / "img" / "a.jpg", image_bytes())
    write(tmp_path / name, text.encode())
    listing = sources.list_source(str(tmp_path), str(tmp_path / name), layout="automl")
    assert listing.task == "multi" and listing.candidates[0].label == "cat;dog"  # tests/test_multi_label.py
    with pytest.raises(sources.DataError) as raised:
        sources.list_source(str(tmp_path), str(tmp_path / name), layout="automl", task="single")
    message = str(raised.value)
    assert "\n" not in message and f"{name} line 1: 2 labels ('cat', 'dog')" in message
    assert "--task single" in message and "--task multi" in message


def test_an_import_without_training_rows_is_refused(tmp_path):
    write(tmp_path / "img" / "a.jpg", image_bytes())
    write(tmp_path / "img" / "b.jpg", image_bytes(seed=1))
    write(tmp_path / "rows.csv", b"VALIDATION,img/a.jpg,cat\nTEST,img/b.jpg,dog\n")
    listing = sources.list_source(str(tmp_path), str(tmp_path / "rows.csv"))
    with pytest.raises(sources.DataError, match="no TRAINING or UNASSIGNED rows, so no train split"):
        sources.check_usable(listing)


# --- evaluation views -----------------------------------------------------------------------------------------

MATRICES = {  # (actual, predicted or -1 below the threshold, count), as TFMA's confusion matrix plot has them
    0.0: [(0, 0, 8), (0, 1, 2), (1, 1, 9), (1, 0, 1)],
    0.5: [(0, 0, 7), (0, -1, 3), (1, 1, 8), (1, -1, 2)],
    0.9: [(0, 0, 2), (0, -1, 8), (1, -1, 10)],
}


def test_views_give_coverage_precision_and_recall_as_the_threshold_moves():
    found = evaluation_views.views(MATRICES, ["cat", "dog"])
    curve = {p["threshold"]: p for p in found["curve"]}
    assert (curve[0.0]["coverage"], curve[0.0]["precision"], curve[0.0]["recall"]) == (1.0, 0.85, 0.85)
    assert (curve[0.5]["coverage"], curve[0.5]["precision"], curve[0.5]["recall"]) == (0.75, 1.0, 0.75)
    assert curve[0.9]["per_class"]["dog"] == {"precision": None, "recall": 0.0}  # no dog predicted
    assert found["chosen"]["threshold"] == 0.0  # none asked for: every image gets a class
    cat = found["at_threshold"]["per_class"]["cat"]
    assert (cat["precision"], cat["recall"], cat["support"], cat["predicted"]) == (8 / 9, 0.8, 10, 9)
    assert cat["f1"] == pytest.approx(2 * (8 / 9) * 0.8 / (8 / 9 + 0.8))


def test_the_threshold_is_given_or_the_lowest_that_reaches_the_target_precision():
    reached = evaluation_views.views(MATRICES, ["cat", "dog"], target_precision=0.95)
    assert reached["chosen"]["threshold"] == 0.5 and "--target-precision" in reached["chosen"]["how"]
    assert reached["at_threshold"]["coverage"] == 0.75
    missed = evaluation_views.views({0.0: MATRICES[0.0]}, ["cat", "dog"], target_precision=0.95)
    assert missed["chosen"]["threshold"] == 0.0 and missed["chosen"]["target_missed"]
    given = evaluation_views.views(MATRICES, ["cat", "dog"], confidence_threshold=0.5)
    assert given["chosen"] == {"threshold": 0.5, "how": "--confidence-threshold 0.5"}
    # A threshold given at which a class is never predicted: kept (it was asked for), and said so.
    given = evaluation_views.views(MATRICES, ["cat", "dog"], confidence_threshold=0.9)
    assert given["chosen"]["threshold"] == 0.9 and given["chosen"]["unreachable"] == ["dog"]
    assert given["chosen"]["how"] == (
        "--confidence-threshold 0.9; above it the model gives no eval image the class 'dog'"
    )
    assert given["at_threshold"]["precision"] == 1.0 and given["at_threshold"]["coverage"] == 0.1
    assert 0.37 in evaluation_views.thresholds_with(0.37)  # an explicit threshold is computed exactly


def test_a_target_precision_never_makes_a_class_unreachable():
    """Precision 0.95 is reached only at 0.9, where no image is called a dog: the highest threshold below it that
    still finds dogs (0.5) goes with the model, and the target is reported missed."""
    matrices = {0.0: MATRICES[0.0], 0.5: [(0, 0, 7), (0, 1, 1), (0, -1, 2), (1, 1, 8), (1, -1, 2)], 0.9: MATRICES[0.9]}
    found = evaluation_views.views(matrices, ["cat", "dog"], target_precision=0.95)
    assert found["chosen"]["threshold"] == 0.5 and found["chosen"]["target_missed"]
    assert "no longer gives any image the class 'dog'" in found["chosen"]["how"]
    assert found["at_threshold"]["per_class"]["dog"]["recall"] == 0.8


# --- prediction output ----------------------------------------------------------------------------------------


def test_results_say_unsure_and_automl_records_keep_classes_at_the_threshold(tmp_path):
    sure = {
        "path": "a/cat.jpg",
        "predictions": [("cat", 0.7), ("dog", 0.2), ("fox", 0.1)],
        "ids": [2, 0, 1],
        "unsure": False,
    }
    unsure = {
        "path": "b.png",
        "predictions": [("dog", 0.4), ("cat", 0.35), ("fox", 0.25)],
        "ids": [0, 2, 1],
        "unsure": True,
    }
    failed = {"path": "c.jpg", "error": "not_an_image: cannot identify image file"}
    assert json.loads(result_files.json_record(sure, top=1)) == {
        "path": "a/cat.jpg",
        "predictions": [{"class": "cat", "probability": 0.7}],
        "unsure": False,
    }
    assert json.loads(result_files.automl_record(sure, 0.15)) == {
        "instance": {"content": "a/cat.jpg", "mimeType": "image/jpeg"},
        "prediction": {"ids": ["2", "0"], "displayNames": ["cat", "dog"], "confidences": [0.7, 0.2]},
    }
    # At exactly the threshold a class is not given, as TFMA counts it in the evaluation's views.
    assert json.loads(result_files.automl_record(sure, 0.2))["prediction"]["displayNames"] == ["cat"]
    assert json.loads(result_files.automl_record(unsure, 0.5))["prediction"] == {
        "ids": [],
        "displayNames": [],
        "confidences": [],
    }
    assert json.loads(result_files.automl_record(failed, 0.5)) == {
        "instance": {"content": "c.jpg", "mimeType": "image/jpeg"},
        "error": {"message": "not_an_image: cannot identify image file"},
    }
    writer = result_files.ResultWriter(str(tmp_path / "r.csv"), top=2)
    for result in (sure, unsure, failed):
        writer.write(result)
    writer.close(complete=True)
    rows = list(csv.DictReader(open(tmp_path / "r.csv", newline="")))
    assert [r["unsure"] for r in rows] == ["no", "yes", ""] and rows[0]["class_2"] == "dog"
    with pytest.raises(image_inputs.InputError, match=r"--automl-output r\.csv: name a \.jsonl file"):
        result_files.output_kind("r.csv", "--automl-output")


# --- Cloud Storage ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_import_files_in_cloud_storage_are_ingested_into_their_splits(digits_dir, tmp_path):
    """A folder of import files in a bucket (gs:// URIs, and paths relative to the CSV), read by ImageExampleGen
    through the real Cloud Storage client against its local stand-in (tests/fake_endpoints.py)."""
    bucket = tmp_path / "bucket"
    uses = ["TRAINING"] * 4 + ["VALIDATION", "TEST", "UNASSIGNED"]  # 7 a class: every object is a request
    rows = make_import_folder(digits_dir, bucket / "automl", "gs://photos-1/automl", uses)
    with open(bucket / "automl" / "digits-5-9.jsonl", "a") as f:  # another bucket: never read
        f.write(
            json.dumps(
                {"imageGcsUri": "gs://someone-else/secret.jpg", "classificationAnnotation": {"displayName": "5"}}
            )
            + "\n"
        )
    with FakeService(buckets={"photos-1": str(bucket)}) as gcs:
        done = run_helper(
            "example_gen_helpers:ingest_main",
            "gs://photos-1/automl",
            str(tmp_path / "out"),
            env={
                **os.environ,
                "STORAGE_EMULATOR_HOST": gcs.url,
                "GOOGLE_APPLICATION_CREDENTIALS": gcs.credentials_file(str(tmp_path)),
            },
            timeout=600,
        )
        read = {r["path"] for r in gcs.find("GET", r"^/download/storage/v1/b/")}
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["summary"]["layout"] == "automl" and found["summary"]["files_seen"] == 71
    assert list(found["quarantine"]) == ["gs://someone-else/secret.jpg"]
    assert found["quarantine"]["gs://someone-else/secret.jpg"]["reason"] == Reason.OUTSIDE_ROOT
    assert not any("someone-else" in path for path in read)
    by_name = {name: (split, label) for split, es in found["examples"].items() for name, label in es}
    assert len(by_name) == 70
    for rel, (_label, split) in rows.items():
        got_split, got_label = by_name[rel]
        assert split in (got_split, None) and got_split in ("train", "eval", "test")
        assert got_split != "test" or split == "test"  # UNASSIGNED rows are hashed into train and eval only
    assert {s: len(es) for s, es in found["examples"].items()}["test"] == 10


# --- a whole run on an AutoML import folder --------------------------------------------------------------------


@pytest.fixture(scope="module")
def automl_run(digits_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("automl") / "flowers-export"
    rows = make_import_folder(digits_dir, data, str(data))
    root = str(tmp_path_factory.mktemp("automl-root"))
    done = run_imagepipe(
        "run",
        "--root",
        root,
        "--data",
        str(data),
        "--epochs",
        "12",
        "--accuracy-threshold",
        "0.2",
        "--target-precision",
        "0.96",
        "--explanations",
        "0",  # nothing here reads them
        "--progress",
        "json",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    outputs = {c["component"]: c["outputs"] for c in events[-1]["components"]}
    return {"root": root, "data": str(data), "rows": rows, "events": events, "outputs": outputs}


def _uri(run, component: str, output: str) -> str:
    return run["outputs"][component][output][0]


def _json(path: str):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_import_rows_land_in_their_splits_and_test_is_scored_apart(automl_run):
    from components.example_gen import ingest_report

    ingest = ingest_report.read_report(_uri(automl_run, "ImageExampleGen", "report"))
    assert ingest["layout"] == "automl" and ingest["files_seen"] == ingest["examples_written"] == 300
    per_split = ingest["examples_per_split"]
    assert per_split["test"] == 50 and per_split["train"] >= 160 and per_split["eval"] >= 60
    assert all(n == 5 for n in ingest["examples_per_split_and_class"]["test"].values())
    evaluation = _uri(automl_run, "Evaluator", "evaluation")
    eval_views, test_views = (
        _json(os.path.join(evaluation, *parts, evaluation_views.VIEWS_FILE)) for parts in ((), ("test",))
    )
    assert eval_views["at_threshold"]["examples"] == per_split["eval"]
    assert test_views["at_threshold"]["examples"] == 50
    # Both splits scored from one pass of the serving model each (components/evaluator/predictions.py)
    on = _json(os.path.join(evaluation, "evaluated_on.json"))
    assert on["scored_from"] == "prediction records" and on["predictions"]["images"] == {
        "eval": per_split["eval"],
        "test": 50,
    }
    chosen = eval_views["chosen"]["threshold"]
    assert test_views["chosen"]["threshold"] == chosen and "the eval split's" in test_views["chosen"]["how"]
    # The lowest threshold reaching the target precision on the eval split.
    curve = eval_views["curve"]
    at = [p for p in curve if p["threshold"] == chosen][0]
    assert chosen > 0 and at["precision"] >= 0.96
    assert all(p["precision"] is None or p["precision"] < 0.96 for p in curve if p["threshold"] < chosen)


@pytest.mark.slow
def test_model_card_is_pushed_and_every_figure_comes_from_the_run(automl_run):
    import tensorflow_model_analysis as tfma

    from components.example_gen import ingest_report
    from components.model_card import CARD_HTML, CARD_MD, THRESHOLD_FILE, TO_FILL_IN
    from trainer.artifact_files import TRAINING_LOG

    pushed = _uri(automl_run, "Pusher", "pushed_model")
    destination = sorted(glob.glob(os.path.join(automl_run["root"], "serving", "*", "*")))[-1]
    card = _json(os.path.join(destination, "model_card.json"))
    assert card == _json(os.path.join(_uri(automl_run, "ModelCard", "model_card"), "model_card.json"))
    assert card == _json(os.path.join(pushed, "model_card.json"))
    ingest = ingest_report.read_report(_uri(automl_run, "ImageExampleGen", "report"))
    data = card["data"]
    assert data["sources"] == [automl_run["data"]] and data["layout"] == "automl"
    assert data["per_class_and_split"] == ingest["examples_per_split_and_class"]
    assert (data["files_seen"], data["examples"], data["quarantined"]) == (300, 300, 0)
    log = _json(os.path.join(_uri(automl_run, "Trainer", "model_run"), TRAINING_LOG))
    training = card["training"]
    assert training["epochs"] == len(log["epochs"]) and training["settings"]["epochs"] == 12
    assert training["lineage"]["run"] == automl_run["events"][-1]["run_id"]
    assert training["lineage"]["base_model"] is None  # the first model of the pipeline
    evaluation = _uri(automl_run, "Evaluator", "evaluation")
    accuracy = [
        kv.value.double_value.value
        for m in tfma.load_metrics(evaluation)
        for kv in m.metric_keys_and_values
        if kv.key.name == "sparse_categorical_accuracy"
    ]
    assert len(accuracy) == 1  # the candidate's (no baseline on a pipeline's first run)
    accuracy = accuracy[0]
    assert card["evaluation"]["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    views = _json(os.path.join(evaluation, evaluation_views.VIEWS_FILE))
    assert card["evaluation"]["confidence_threshold"] == views["chosen"]
    assert card["evaluation"]["per_class"]["3"]["recall"] == views["at_threshold"]["per_class"]["3"]["recall"]
    assert card["evaluation"]["blessed"] and card["evaluation"]["blessing_reason"].startswith("blessed: eval accuracy")
    assert card["evaluation"]["test"]["examples"] == 50
    assert all(v.startswith(TO_FILL_IN) for v in card["to_fill_in"].values())
    assert _json(os.path.join(destination, THRESHOLD_FILE)) == views["chosen"]
    markdown = open(os.path.join(destination, CARD_MD)).read()
    assert f"**accuracy**: {card['evaluation']['accuracy']:.4f}" in markdown and TO_FILL_IN in markdown
    html = open(os.path.join(destination, CARD_HTML)).read()
    assert "<html" in html and TO_FILL_IN in html and "## " not in html


@pytest.mark.slow
def test_predict_answers_unsure_below_the_models_threshold(automl_run, tmp_path):
    test_images = [
        os.path.join(automl_run["data"], rel) for rel, (_, split) in automl_run["rows"].items() if split == "test"
    ]
    folder = tmp_path / "incoming"
    for path in test_images:
        shutil.copy(path, write(folder / os.path.basename(path), b""))
    threshold = _json(sorted(glob.glob(os.path.join(automl_run["root"], "serving", "*", "*", "threshold.json")))[-1])
    done = run_imagepipe(
        "predict",
        "--root",
        automl_run["root"],
        "--top",
        "2",
        "--output",
        str(tmp_path / "out.csv"),
        "--automl-output",
        str(tmp_path / "automl.jsonl"),
        str(folder),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"confidence threshold {threshold['threshold']:g} (the lowest reaching precision 0.96" in done.stderr
    rows = list(csv.DictReader(open(tmp_path / "out.csv", newline="")))
    assert len(rows) == 50
    assert all(r["unsure"] == ("yes" if float(r["probability_1"]) <= threshold["threshold"] else "no") for r in rows)
    unsure = sum(r["unsure"] == "yes" for r in rows)
    assert 0 < unsure < 50
    classes = _json(
        os.path.join(sorted(glob.glob(os.path.join(automl_run["root"], "serving", "*", "*")))[-1], "model_card.json")
    )["model"]["classes"]
    records = [json.loads(line) for line in open(tmp_path / "automl.jsonl")]
    assert [r["instance"]["content"] for r in records] == [r["path"] for r in rows]
    for record, row in zip(records, rows):
        found = record["prediction"]
        assert [classes[int(i)] for i in found["ids"]] == found["displayNames"]
        assert all(c > threshold["threshold"] for c in found["confidences"])
        assert found["confidences"] == sorted(found["confidences"], reverse=True)
        assert (found["displayNames"] == []) == (row["unsure"] == "yes")
        if found["displayNames"]:
            assert found["displayNames"][0] == row["class_1"]


@pytest.mark.slow
def test_report_shows_the_threshold_views_and_the_test_split_in_a_real_browser(automl_run):
    report = automl_run["events"][-1]["report"]
    check = """(() => ({charts: document.querySelectorAll('#evaluation svg').length,
                        text: document.querySelector('#evaluation').innerText}))()"""
    seen = open_page("file://" + report, check, os.path.join(ARTIFACTS, "report-automl.png"))
    assert seen["errors"] == []
    text = seen["check"]["text"]
    for expected in (
        "Per class at confidence threshold",
        "the lowest reaching precision 0.96 (--target-precision)",
        "as the threshold moves",
        "precision-recall, overall",
        "precision-recall per class",
        "Test split",
        "Scored apart (it blesses nothing)",
        "on 50 test examples",
        "Model card",
    ):
        assert expected in text, expected
    assert seen["check"]["charts"] >= 5  # the threshold chart, two PR charts, two confusion matrices


def test_the_summary_line_of_a_card_whose_threshold_no_image_reaches():
    from runs.run_text import describe_card

    card = {
        "card_md": "card.md",
        "card": {
            "evaluation": {
                "confidence_threshold": {"threshold": 0.99, "how": "--confidence-threshold 0.99"},
                "at_threshold": {"precision": None, "recall": 0.0, "coverage": 0.0},
                "test": None,
            }
        },
    }
    assert describe_card(card) == "card.md; confidence threshold 0.99"


def test_dataflow_batch_prediction_refuses_a_local_automl_output():
    from pipeline.cloud_config import CloudConfig
    from pipeline.config import PipelineConfig
    from prediction import batch_predict

    cloud = CloudConfig(
        project="proj-1",
        region="europe-west4",
        image="europe-docker.pkg.dev/proj-1/ml/imagepipe:1",
        pipeline_root="gs://bucket-1/pipelines",
    )
    args = (cloud, PipelineConfig(), "gs://bucket-1/serving/1", "gs://bucket-1/out.jsonl", ["gs://bucket-1/in"])
    assert batch_predict.check_dataflow(*args).startswith("gs://")
    with pytest.raises(image_inputs.InputError, match=r"--automl-output automl\.jsonl: Dataflow workers cannot"):
        batch_predict.check_dataflow(*args, automl_output="automl.jsonl")


def test_a_pushed_tflite_model_has_its_versions_threshold(tmp_path):
    from prediction import predict

    version = tmp_path / "serving" / "1795538973"
    write(version / "threshold.json", json.dumps({"threshold": 0.6, "how": "--confidence-threshold 0.6"}).encode())
    write(version / "tflite" / "model_float16.tflite", b"")
    assert predict.model_threshold(str(version)) == (0.6, "--confidence-threshold 0.6")
    assert predict.model_threshold(str(version / "tflite" / "model_float16.tflite")) == (
        0.6,
        "--confidence-threshold 0.6",
    )
    assert predict.model_threshold(str(tmp_path)) == (0.0, "none")


def test_a_folder_of_import_files_with_os_clutter_and_a_label_that_is_not_text(tmp_path):
    write(tmp_path / "img" / "a.jpg", image_bytes())
    write(
        tmp_path / "rows.jsonl",
        (json.dumps({"imageGcsUri": "img/a.jpg", "classificationAnnotation": {"displayName": 7}}) + "\n").encode(),
    )
    write(tmp_path / "Thumbs.db", b"\0")  # as Windows leaves beside files; skipped as ingestion skips it
    listing = sources.list_source(str(tmp_path), str(tmp_path))
    assert listing.layout == "automl"
    (row,) = listing.candidates
    assert row.problem == (Reason.UNREADABLE, "rows.jsonl line 1: classificationAnnotation.displayName is not text")
