"""Multi-label classification: several labels an image (none included), from the manifest and AutoML import files
to the pushed model: a sigmoid per label, a threshold per label chosen on held-out train images, every label judged, the model card,
`imagepipe predict` listing every label over its threshold, AutoML's batch output, and the label check."""

import collections
import csv
import glob
import json
import os

import numpy as np
import pytest
from commands import run_imagepipe
from conftest import image_bytes, write

from bench.multilabel import make_multilabel
from components.evaluator import multi_label as multi_label_evaluation
from components.health import label_issues
from images.finding import sources
from images.finding.listing import labels_of
from prediction import result_files
from trainer import class_balance

# --- sources: which rows are multi-label, and how a row without labels counts ----------------------------------


def _images(root, names):
    for name in names:
        write(os.path.join(root, "img", name), image_bytes(seed=hash(name) % 100))


def test_a_labels_column_and_automl_multi_label_files_list_label_sets(tmp_path):
    _images(tmp_path, ["a.jpg", "b.jpg", "c.jpg"])
    write(tmp_path / "labels.csv", b"path,labels\nimg/a.jpg,dog;person\nimg/b.jpg,\nimg/c.jpg,cat\n")
    write(tmp_path / "rows.csv", b"TRAINING,img/a.jpg,person,dog\nVALIDATION,img/b.jpg\nimg/c.jpg,cat\n")
    write(
        tmp_path / "rows.jsonl",
        "\n".join(
            json.dumps(item)
            for item in [
                {
                    "imageGcsUri": "img/a.jpg",
                    "classificationAnnotations": [{"displayName": "dog"}, {"displayName": "person"}],
                },
                {"imageGcsUri": "img/b.jpg", "classificationAnnotations": []},
                {"imageGcsUri": "img/c.jpg", "classificationAnnotations": [{"displayName": "cat"}]},
            ]
        ).encode(),
    )
    for name, layout in (("labels.csv", "manifest"), ("rows.csv", "automl"), ("rows.jsonl", "automl")):
        listing = sources.list_source(str(tmp_path), str(tmp_path / name))
        sources.check_usable(listing)
        assert (listing.layout, listing.task) == (layout, "multi")
        labels = {c.rel_path: c.label for c in listing.candidates}
        # A row without labels is an image no label applies to (a negative for every label), not a missing label.
        assert labels["img/b.jpg"] == "" and all(c.problem is None for c in listing.candidates)
        assert labels_of(labels["img/a.jpg"]) == ["dog", "person"]
    assert listing.classes == ["cat", "dog", "person"]
    write(tmp_path / "spelt.csv", b"path,labels\nimg/a.jpg, Dog ;cat;dog\n")
    manifest = sources.list_source(str(tmp_path), str(tmp_path / "spelt.csv"))
    assert manifest.candidates[0].label == "Dog;cat;dog"  # each name once, trimmed, as written
    with pytest.raises(sources.DataError) as caught:  # "Dog" and "dog" would train as two labels
        sources.check_usable(manifest)
    assert "differ only by case" in str(caught.value)


def test_the_task_is_forced_or_refused_in_one_line(tmp_path):
    _images(tmp_path, ["a.jpg"])
    write(tmp_path / "rows.csv", b"img/a.jpg,person,dog\n")
    with pytest.raises(sources.DataError) as caught:
        sources.list_source(str(tmp_path), str(tmp_path / "rows.csv"), layout="automl", task="single")
    message = str(caught.value)
    assert (
        "\n" not in message and "rows.csv line 1: 2 labels ('person', 'dog')" in message and "--task multi" in message
    )
    # One label a row, forced multi-label: each row's set has its one label.
    write(tmp_path / "one.csv", b"img/a.jpg,person\n")
    forced = sources.list_source(str(tmp_path), str(tmp_path / "one.csv"), layout="automl", task="multi")
    assert forced.task == "multi" and forced.candidates[0].label == "person"
    write(tmp_path / "folders" / "cat" / "a.jpg", image_bytes())
    with pytest.raises(sources.DataError) as caught:
        sources.list_source(str(tmp_path / "folders"), str(tmp_path / "folders"), task="multi")
    assert "class folders give each image one label" in str(caught.value) and "\n" not in str(caught.value)
    # The run's pre-flight check knows the task: each of these was a recorded run failing in ImageExampleGen.
    from pipeline import preflight
    from pipeline.config import PipelineConfig

    for n in range(4):
        write(tmp_path / "img" / f"{n}.jpg", image_bytes(seed=n))
    write(tmp_path / "multi.csv", b"path,labels\nimg/0.jpg,dog;cat\nimg/1.jpg,cat\nimg/2.jpg,\nimg/3.jpg,dog\n")
    write(tmp_path / "lone.csv", b"path,labels\nimg/0.jpg,dog\nimg/1.jpg,\nimg/2.jpg,dog\nimg/3.jpg,\n")
    write(
        tmp_path / "late.csv",
        b"path,labels,split\nimg/0.jpg,dog,train\nimg/1.jpg,cat,train\nimg/2.jpg,bird,eval\nimg/3.jpg,dog;cat,test\n",
    )
    for data, task, expected in (
        ("multi.csv", "single", "--task multi"),
        ("folders", "multi", "class folders give each image one label"),
        (
            "lone.csv",
            "multi",
            "a multi-label set with one label ('dog'); that is a yes/no question: give it as two classes",
        ),
        ("late.csv", "multi", "label 'bird' only on eval or test rows"),
    ):
        config = PipelineConfig(data=str(tmp_path / data), task=task, root=str(tmp_path / "root"))
        with pytest.raises(sources.DataError) as caught:
            preflight.preflight(config)
        assert expected in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


# --- training and evaluation figures, plain Python --------------------------------------------------------------


def test_rare_labels_weigh_their_positives_and_start_at_their_share():
    plan = class_balance.multi_label_plan("auto", [500, 40, 250], 1000, ["person", "dog", "cat"])
    assert plan["mode"] == "weights" and plan["monitor"] == class_balance.MACRO_AUC_PR
    # 'dog' is on 40 of 1,000 images: its positives weigh 960 / 40 = 24, capped at MAX_WEIGHT; the others 1.
    assert plan["positive_weights"] == [1.0, class_balance.MAX_WEIGHT, 1.0]
    share = 20 * 40 / (20 * 40 + 960)
    assert plan["initial_bias"][1] == pytest.approx(np.log(share / (1 - share)), rel=1e-9)
    assert plan["initial_bias"][0] == pytest.approx(0.0, abs=1e-12)
    off = class_balance.multi_label_plan("off", [500, 40, 250], 1000, ["person", "dog", "cat"])
    assert off["mode"] == "off" and off["positive_weights"] is None


def _matrices(per_threshold):
    """ConfusionMatrixAtThresholds rows (threshold, tp, fp, tn, fn) from {threshold: (tp, fp, fn)} of 100 images."""
    return [(t, tp, fp, 100 - tp - fp - fn, fn) for t, (tp, fp, fn) in sorted(per_threshold.items())]


def test_each_label_gets_its_own_threshold_and_is_judged_at_it():
    found = {
        "example_count": 100,
        "macro_auc_pr": 0.8,
        "per_label": {
            # 'dog': every image positive at 0, best F1 at 0.5, precision 0.9 first reached at 0.75
            0: {
                "auc_pr": 0.9,
                "matrices": _matrices({0.0: (20, 80, 0), 0.25: (20, 20, 0), 0.5: (18, 4, 2), 0.75: (9, 1, 11)}),
            },
            # 'cat': rare, never 0.9 precise
            1: {
                "auc_pr": 0.4,
                "matrices": _matrices({0.0: (12, 88, 0), 0.25: (8, 12, 4), 0.5: (4, 6, 8), 0.75: (1, 2, 11)}),
            },
        },
    }
    best = multi_label_evaluation.views(found, ["dog", "cat"])
    assert best["chosen"]["thresholds"] == {"dog": 0.5, "cat": 0.25}  # best F1, never 0 (every image the label)
    assert best["at_threshold"]["per_class"]["dog"]["recall"] == pytest.approx(0.9)
    aimed = multi_label_evaluation.views(found, ["dog", "cat"], target_precision=0.9)
    assert aimed["chosen"]["thresholds"] == {"dog": 0.75, "cat": 0.25}
    assert aimed["labels"]["cat"]["chosen"]["target_missed"] and aimed["chosen"]["target_missed"] == ["cat"]
    gate = multi_label_evaluation.label_gate(
        ["dog", "cat"], {"dog": 20, "cat": 12}, {"dog": 80, "cat": 50}, 0.5, 0.5, False
    )
    assert gate["judged"] == [0, 1]
    assert multi_label_evaluation.label_failures(gate, best) == []
    failures = multi_label_evaluation.label_failures(gate, aimed)
    assert failures == ["label 'dog' recall 0.45 < 0.50 at its threshold 0.75 (20 eval images) (--min-class-recall)"]
    # The test split is scored at the eval split's thresholds.
    test = multi_label_evaluation.views(found, ["dog", "cat"], given={"dog": 0.75, "cat": 0.5}, how="the eval split's")
    assert test["chosen"]["thresholds"] == {"dog": 0.75, "cat": 0.5}
    assert test["labels"]["cat"]["chosen"]["how"] == "the eval split's"


def test_a_label_at_chance_level_fails_its_gate_and_one_on_every_image_is_left_out_of_the_macro_figure():
    """A label given at random ('coin', in no pixel) scores its base rate, and its best-F1 threshold gives it to every
    image: it fails its own gate in one line naming it. A label on every image ('photo') scores a perfect AUC-PR
    whatever the model does: it lifts no macro figure."""
    found = {
        "example_count": 100,
        "macro_auc_pr": 0.9,
        "per_label": {
            0: {"auc_pr": 0.9, "matrices": _matrices({0.0: (20, 80, 0), 0.25: (20, 20, 0), 0.5: (18, 4, 2)})},
            1: {"auc_pr": 0.51, "matrices": _matrices({0.0: (50, 50, 0), 0.25: (50, 50, 0), 0.5: (26, 24, 24)})},
            2: {"auc_pr": 1.0, "matrices": _matrices({0.0: (100, 0, 0), 0.25: (100, 0, 0), 0.5: (97, 0, 3)})},
            3: {"auc_pr": 0.45, "matrices": _matrices({0.0: (16, 84, 0), 0.25: (12, 30, 4), 0.5: (6, 12, 10)})},
        },
    }
    names = ["dog", "coin", "photo", "rare"]
    views = multi_label_evaluation.views(found, names)
    assert views["at_threshold"]["uninformative"] == ["photo"]
    assert views["at_threshold"]["macro_f1"] == pytest.approx(
        sum(views["at_threshold"]["per_class"][n]["f1"] for n in ("dog", "coin", "rare")) / 3
    )
    gate = multi_label_evaluation.label_gate(
        names,
        {"dog": 20, "coin": 50, "photo": 100, "rare": 16},
        {"dog": 80, "coin": 200, "photo": 400, "rare": 64},
        0.5,
        0.5,
        False,
        100,
    )
    failures = multi_label_evaluation.label_failures(gate, views)
    assert failures == [
        "label 'coin' AUC-PR 0.51 at its base rate 0.50 (50 of 100 eval images): the model cannot "
        "tell it from chance; check its labels, or leave it out"
    ]
    # No curve's area to read, and a threshold that says yes to every image (given with --confidence-threshold):
    views["at_threshold"]["per_class"]["coin"].update(auc_pr=None, predicted=100, threshold=0.25)
    assert "given to every eval image at its threshold 0.25" in multi_label_evaluation.label_failures(gate, views)[0]
    # A label most images have, that the model tells apart: its best F1 is at a threshold that says yes to all (F1
    # 0.95 here), which tells nothing; the threshold chosen is the best of those that do not.
    frequent = multi_label_evaluation.views(
        {
            "example_count": 100,
            "per_label": {
                0: {
                    "auc_pr": 0.99,
                    "matrices": _matrices({0.0: (90, 10, 0), 0.1: (90, 10, 0), 0.5: (84, 1, 6), 0.75: (70, 0, 20)}),
                }
            },
        },
        ["sky"],
    )
    assert frequent["chosen"]["thresholds"] == {"sky": 0.5}
    # TFMA's macro AUC-PR, the figure blessing reads, weighs the informative labels only.
    from pipeline.pipeline import eval_config

    config, _ = multi_label_evaluation.eval_config_for(
        eval_config(0.7), 4, False, eval_support=[20, 50, 100, 16], eval_images=100
    )
    macro = [s for s in config.metrics_specs if s.HasField("aggregate")][0]
    assert dict(macro.aggregate.class_weights) == {0: 1.0, 1: 1.0, 3: 1.0}


def test_multi_label_results_list_every_label_over_its_threshold():
    result = {
        "path": "gs://b/x.jpg",
        "predictions": [("dog", 0.9)],
        "ids": [2],
        "labels": [("dog", 0.9), ("cat", 0.4)],
        "label_ids": [2, 0],
        "unsure": False,
    }
    record = json.loads(result_files.automl_record(result, {"dog": 0.5, "cat": 0.3}))
    assert record == {
        "instance": {"content": "gs://b/x.jpg", "mimeType": "image/jpeg"},
        "prediction": {"ids": ["2", "0"], "displayNames": ["dog", "cat"], "confidences": [0.9, 0.4]},
    }
    none = json.loads(result_files.automl_record({**result, "labels": [], "label_ids": []}, {"dog": 0.5}))
    assert none["prediction"] == {"ids": [], "displayNames": [], "confidences": []}
    assert result_files.csv_header(1, multi_label=True) == [
        "path",
        "class_1",
        "probability_1",
        "labels",
        "unsure",
        "error",
    ]
    assert result_files.csv_cells(result, 1, multi_label=True)[3] == "dog;cat"
    assert json.loads(result_files.json_record(result))["labels"] == [
        {"label": "dog", "probability": 0.9},
        {"label": "cat", "probability": 0.4},
    ]


def test_the_multi_label_check_finds_missing_and_extra_labels_on_features():
    """cleanlab's multi-label confident learning on out-of-sample probabilities from features: images whose label
    set lost a label or gained one are ranked first."""
    rng = np.random.default_rng(0)
    truth = (rng.random((600, 4)) < [0.5, 0.4, 0.3, 0.2]).astype(np.float32)
    vectors = truth @ rng.normal(size=(4, 32)) * 3 + rng.normal(size=(600, 32))
    given = [list(np.flatnonzero(row)) for row in truth]
    flipped = rng.choice(600, 30, replace=False)
    for i in flipped:
        label = int(rng.integers(4))
        given[i] = sorted(set(given[i]) ^ {label})  # a label removed, or one added
    hot = label_issues.multi_hot(given, 4)
    folds, why = label_issues.multi_label_folds(hot)
    assert folds == label_issues.FOLDS and not why
    probabilities = label_issues.multi_label_probabilities_from_features(vectors, hot, folds, seed=0)
    suspects = label_issues.rank_multi_label(given, probabilities)
    found = {s.index for s in suspects[:60]} & set(flipped.tolist())
    assert len(found) >= 24, f"{len(found)} of 30 flipped label sets among the first 60 suspects"
    first = suspects[0]
    assert first.given == given[first.index] and first.suggested != first.given


# --- whole runs: an AutoML JSON Lines import, through the pushed model, and a CSV manifest ------------------------


@pytest.fixture(scope="module")
def colour_set(tmp_path_factory):
    """600 images with 0-3 of five coloured squares, their labels in labels.csv, import.jsonl and import.csv."""
    return make_multilabel(str(tmp_path_factory.mktemp("multilabel") / "colours"), images=600, seed=3, kind="colours")


# The small CNN: these runs are about multi-label mechanics on 96 px coloured squares (--model auto would take the
# pretrained backbone for their size, which a 48 px input does not suit).
# No explanations: nothing here reads them (test_explanations.py does).
RUN = ("--model", "cnn", "--epochs", "20", "--image-size", "48", "--accuracy-threshold", "0.5", "--explanations", "0")
RUN += ("--progress", "json")


def _run(data: str, root: str, *extra: str) -> dict:
    done = run_imagepipe("run", "--root", root, "--data", data, *RUN, *extra, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    outputs = {c["component"]: c["outputs"] for c in events[-1]["components"]}
    return {"root": root, "outputs": outputs, "events": events}


IMPORT_SPLITS = {"training": "train", "validation": "eval", "test": "test"}  # an AutoML import file's ml_use
LABEL_CHECK = ("--label-check", "on")


@pytest.fixture(scope="module")
def import_run(colour_set, tmp_path_factory):
    """The set through AutoML's multi-label JSON Lines import, 20 train images each with one of its labels left out,
    --label-check on (a multi-label cnn on pixels, out of fold): the run that the label check's test and the model's
    (thresholds, push, predict, the rerun) read. Its `rows`: [(path, [labels], split)] as the import file gives them;
    `planted`: the paths whose label was left out."""
    items = [json.loads(line) for line in open(os.path.join(colour_set, "import.jsonl"))]
    planted = []
    for item in items:
        use = item["dataItemResourceLabels"]["aiplatform.googleapis.com/ml_use"]
        if use == "training" and len(item["classificationAnnotations"]) >= 2 and len(planted) < 20:
            item["classificationAnnotations"] = item["classificationAnnotations"][1:]
            planted.append(item["imageGcsUri"])
    # Beside the images (a row may name only files below its import file's folder); the other tests' files stay.
    data = write(os.path.join(colour_set, "planted.jsonl"), "".join(json.dumps(item) + "\n" for item in items).encode())
    rows = [
        (
            os.path.join(colour_set, item["imageGcsUri"]),
            [a["displayName"] for a in item["classificationAnnotations"]],
            IMPORT_SPLITS[item["dataItemResourceLabels"]["aiplatform.googleapis.com/ml_use"]],
        )
        for item in items
    ]
    run = _run(data, str(tmp_path_factory.mktemp("multilabel-root")), *LABEL_CHECK)
    return {**run, "data": data, "rows": rows, "planted": planted}


def _assert_counted(report, rows) -> None:
    """ImageExampleGen's counts of each label and of images without one, a split each, against the rows given."""
    for split in ("train", "eval", "test"):
        counted = collections.Counter(n for _, names, s in rows if s == split for n in names)
        assert report["examples_per_split_and_class"][split] == dict(counted)
        assert report["examples_without_labels"][split] == sum(1 for _, names, s in rows if s == split and not names)


def _json(*parts):
    with open(os.path.join(*parts)) as f:
        return json.load(f)


@pytest.mark.slow
def test_an_import_run_writes_label_sets_and_counts_each_label(import_run, colour_set):
    import tensorflow as tf

    from components.example_gen import SUMMARY_FILE
    from images import feature_keys

    rows = import_run["rows"]
    report = _json(import_run["outputs"]["ImageExampleGen"]["report"][0], SUMMARY_FILE)
    assert report["task"] == "multi" and report["examples_written"] == 600
    _assert_counted(report, rows)
    examples = import_run["outputs"]["ImageExampleGen"]["examples"][0]
    truth = {os.path.relpath(path, colour_set): names for path, names, _ in rows}
    seen = 0
    for record in tf.data.TFRecordDataset(glob.glob(os.path.join(examples, "Split-eval", "*")), "GZIP"):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        names = [v.decode() for v in feature[feature_keys.LABELS_TEXT].bytes_list.value]
        assert names == truth[feature[feature_keys.FILENAME].bytes_list.value[0].decode()]
        assert [report["label_map"][n] for n in names] == list(feature[feature_keys.LABELS].int64_list.value)
        assert feature_keys.LABEL not in feature
        seen += 1
    assert seen == report["examples_per_split"]["eval"]
    # The data profile the next run's drift is measured against counts images, not label occurrences.
    from components.example_gen import PROFILE_FILE

    assert _json(examples, PROFILE_FILE)["examples"] == 600


@pytest.mark.slow
def test_a_multi_label_model_is_judged_per_label_and_pushed_with_its_thresholds(import_run):
    from components.model_card import CARD_JSON, CARD_MD, THRESHOLD_FILE
    from trainer.artifact_files import TRAINING_LOG

    log = _json(import_run["outputs"]["Trainer"]["model_run"][0], TRAINING_LOG)
    assert log["class_balance"]["task"] == "multi" and log["class_balance"]["monitor"] == "val_auc_pr"
    assert "val_auc_pr" in log["epochs"][-1]
    evaluation = import_run["outputs"]["Evaluator"]["evaluation"][0]
    views, gate = _json(evaluation, "views.json"), _json(evaluation, "class_gate.json")
    names = gate["class_names"]
    assert sorted(names) == ["blue", "green", "magenta", "red", "yellow"] and gate["failures"] == []
    # Each label's threshold is the Trainer's, chosen on its held-out train images (the best F1 there), never on
    # eval; the Evaluator judges each label at it, and its recall there reaches the floor.
    chosen = log["operating_point"]
    thresholds = views["chosen"]["thresholds"]
    assert thresholds == chosen["thresholds"] and views["chosen"]["how"] == "best F1 on held-out train images"
    assert chosen["held_out"]["images"] == log["held_out"]["held_out_examples"] > 0
    for name in names:
        held = chosen["held_out"]["per_label"][name]
        assert held["threshold"] == thresholds[name] and held["f1"] is not None
        at = views["at_threshold"]["per_class"][name]
        assert at["threshold"] == thresholds[name]
        assert at["recall"] >= gate["min_class_recall"]
    assert views["at_threshold"]["macro_auc_pr"] > 0.9
    test_views = _json(evaluation, "test", "views.json")
    assert test_views["chosen"]["thresholds"] == thresholds
    serving = sorted(glob.glob(os.path.join(import_run["root"], "serving", "*", "*")))[-1]
    assert _json(serving, THRESHOLD_FILE) == {
        "task": "multi",
        "thresholds": thresholds,
        "how": "best F1 on held-out train images",
    }
    card = _json(serving, CARD_JSON)
    assert card["model"]["task"] == "multi" and card["evaluation"]["label_thresholds"] == thresholds
    assert card["evaluation"]["blessed"] and "each of the 5 labels" in card["evaluation"]["blessing_reason"]
    # The Trainer's own export, never pushed, has no threshold.json: each label at 0.5, from its model_info.json.
    from prediction import predict

    exported = os.path.join(import_run["outputs"]["Trainer"]["model"][0], "Format-Serving")
    assert predict.model_threshold(exported) == ({n: 0.5 for n in names}, "none chosen: 0.5 for every label")
    markdown = open(os.path.join(serving, CARD_MD)).read()
    for name in names:
        row = card["evaluation"]["per_class"][name]
        assert f"| {name} | {row['threshold']:.4f} | {row['precision']:.4f} | {row['recall']:.4f} |" in markdown


@pytest.mark.slow
def test_a_noise_label_is_never_blessed_and_a_label_on_every_image_lifts_nothing(colour_set, tmp_path):
    """The fourth hardening round's case: a label given at random ('coin', in no pixel) was blessed and pushed
    (macro AUC-PR 0.93), the model giving it to every image. Now it fails its own gate, in one line naming it, and
    the run pushes nothing; a label on every image ('photo') is left out of the macro figure. A CSV manifest: its label
    sets are counted as given."""
    rng = np.random.default_rng(11)
    rows = list(csv.DictReader(open(os.path.join(colour_set, "labels.csv"))))
    for row in rows:
        row["labels"] = ";".join(
            [n for n in row["labels"].split(";") if n] + ["photo"] + (["coin"] if rng.random() < 0.5 else [])
        )
    noisy = os.path.join(colour_set, "noisy.csv")
    with open(noisy, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["path", "labels", "split"])
        writer.writeheader()
        writer.writerows(rows)
    run = _run(noisy, str(tmp_path / "root"))
    # A CSV manifest's label sets, counted as given (the JSON Lines import's: test_an_import_run_writes_...)
    from components.example_gen import SUMMARY_FILE

    report = _json(run["outputs"]["ImageExampleGen"]["report"][0], SUMMARY_FILE)
    assert report["task"] == "multi" and report["examples_written"] == 600
    given = [(r["path"], [n for n in r["labels"].split(";") if n], r["split"]) for r in rows]
    _assert_counted(report, given)
    evaluation = run["outputs"]["Evaluator"]["evaluation"][0]
    views, gate = _json(evaluation, "views.json"), _json(evaluation, "class_gate.json")
    assert [f.split(" (")[0].split(" AUC-PR")[0].split(" given")[0] for f in gate["failures"]] == ["label 'coin'"], (
        gate["failures"]
    )
    assert "the model cannot tell it from chance" in gate["failures"][0]
    assert views["at_threshold"]["uninformative"] == ["photo"]
    assert not glob.glob(os.path.join(run["root"], "serving", "*", "*"))  # nothing pushed


@pytest.mark.slow
def test_predict_lists_every_label_over_its_threshold_and_writes_automl_records(import_run, tmp_path):
    rows = [(path, names) for path, names, split in import_run["rows"] if split == "test"]  # none planted
    done = run_imagepipe(
        "predict",
        "--root",
        import_run["root"],
        "--output",
        str(tmp_path / "out.csv"),
        "--automl-output",
        str(tmp_path / "automl.jsonl"),
        *[path for path, _ in rows],
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    thresholds = _json(sorted(glob.glob(os.path.join(import_run["root"], "serving", "*", "*", "threshold.json")))[-1])
    assert "multi-label: a label applies above its threshold (best F1 on held-out train images)" in done.stderr
    found = {r["path"]: r for r in csv.DictReader(open(tmp_path / "out.csv", newline=""))}
    records = [json.loads(line) for line in open(tmp_path / "automl.jsonl")]
    assert [r["instance"]["content"] for r in records] == [path for path, _ in rows]
    right = 0
    for (path, names), record in zip(rows, records):
        prediction = record["prediction"]
        assert found[path]["labels"] == ";".join(prediction["displayNames"])
        assert all(
            c > thresholds["thresholds"][n] for n, c in zip(prediction["displayNames"], prediction["confidences"])
        )
        assert prediction["confidences"] == sorted(prediction["confidences"], reverse=True)
        right += sorted(prediction["displayNames"]) == names
    several = sum(len(r["prediction"]["displayNames"]) > 1 for r in records)
    assert several >= 10 and right >= 0.8 * len(rows), (several, right, len(rows))


@pytest.mark.slow
def test_a_json_lines_import_runs_and_the_label_check_finds_planted_missing_labels(import_run):
    """Through AutoML's multi-label JSON Lines, 20 train images each with one of its labels left out: the multi-label
    label check (--label-check on: a multi-label cnn on pixels, out of fold) ranks them."""
    health = import_run["outputs"]["DataHealth"]["health"][0]
    result = _json(health, "health.json")
    assert result["task"] == "multi" and result["label_check_method"].endswith("multi-label cnn on pixels")
    suspects = list(csv.DictReader(open(os.path.join(health, "label_issues.csv"), newline="")))
    first = [s["path"] for s in suspects[:40]]
    hits = [p for p in import_run["planted"] if any(f.endswith(p) for f in first)]
    assert len(hits) >= 10, f"{len(hits)} of 20 planted missing labels among the first 40 suspects"
    assert all(set(s["given"].split(";")) != set(s["suggested"].split(";")) for s in suspects[:10])
    assert _json(import_run["outputs"]["Evaluator"]["evaluation"][0], "class_gate.json")["task"] == "multi"


@pytest.mark.slow
def test_a_rerun_is_compared_with_the_last_blessed_model_on_macro_auc_pr(import_run):
    """The same data again: the Evaluator runs again (a blessed model now exists) and compares the candidate with it
    on macro AUC-PR; the same model scores the same, so it is blessed again, and the card says what it was compared
    with."""
    from components.model_card import CARD_JSON

    again = _run(import_run["data"], import_run["root"], *LABEL_CHECK)
    evaluation = again["outputs"]["Evaluator"]["evaluation"][0]
    assert evaluation != import_run["outputs"]["Evaluator"]["evaluation"][0]
    gate = _json(evaluation, "class_gate.json")
    assert gate["compared_on"] == "macro_auc_pr" and gate["failures"] == []
    card = _json(again["outputs"]["ModelCard"]["model_card"][0], CARD_JSON)["evaluation"]
    first = _json(import_run["outputs"]["Evaluator"]["evaluation"][0], "views.json")["at_threshold"]["macro_auc_pr"]
    assert card["blessed"] and card["last_blessed"]["macro_auc_pr"] == pytest.approx(first, rel=1e-6)
    assert f"macro AUC-PR {card['macro_auc_pr']:.4f} not below the last blessed model's" in card["blessing_reason"]


def test_the_label_check_and_the_macro_average_leave_out_what_cannot_be_scored():
    # A label on every image (nothing to tell apart) does not stop the check of the others.
    hot = np.zeros((40, 3), np.float32)
    hot[:, 0], hot[:20, 1], hot[::4, 2] = 1, 1, 1
    assert label_issues.multi_label_folds(hot) == (5, "")
    assert label_issues.multi_label_folds(hot[:, :1])[0] == 0
    # Macro AUC-PR averages the labels with eval images (TFMA would count a label without any as 0).
    from tensorflow_model_analysis.proto import config_pb2 as tfma_config

    from pipeline.pipeline import eval_config

    config, bound = multi_label_evaluation.eval_config_for(eval_config(0.7), 3, False, eval_support=[5, 0, 9])
    macro = [s for s in config.metrics_specs if s.HasField("aggregate")][0]
    assert dict(macro.aggregate.class_weights) == {0: 1.0, 2: 1.0} and bound == pytest.approx(0.7)
    assert macro.metrics[0].threshold.value_threshold.lower_bound.value == pytest.approx(0.7)
    assert isinstance(config, tfma_config.EvalConfig) and config.model_specs[0].label_key == "labels"


def test_multi_label_splits_honour_the_eval_percent_per_label(tmp_path):
    """Stratified by their whole label set, multi-label files made strata of one or two: 500 labels on 60 images put
    none in eval (the run failed), and pairs of images put one of each pair there (19 of 60 at 20%). By the rarest
    label, small strata pooled, the eval share is --eval-percent's, overall and for each common label."""
    from example_gen_helpers import read_examples, run_executor
    from tfx.proto import example_gen_pb2

    from pipeline.pipeline_inputs import hash_split_output

    rng = np.random.default_rng(2)
    names = [f"l{n:03d}" for n in range(500)]
    cases = {
        "many": [";".join(rng.choice(names, size=6, replace=False)) for _ in range(60)],
        "pairs": [f"a{n // 2};b" for n in range(60)],
        "common": [
            ";".join(["sky"] + (["dog"] if n % 3 == 0 else []) + (["cat"] if n % 4 == 0 else [])) for n in range(400)
        ],
    }
    for case, label_sets in cases.items():
        folder = tmp_path / case
        rows = ["path,labels"]
        for n, labels in enumerate(label_sets):
            write(folder / "img" / f"{n}.png", image_bytes("PNG", size=(8, 8), seed=1000 * len(case) + n))
            rows.append(f"img/{n}.png,{labels}")
        (folder / "labels.csv").write_text("\n".join(rows) + "\n")
        single = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern="labels.csv")])
        examples, _ = run_executor(
            str(folder),
            tmp_path / f"out-{case}",
            input_config=single,
            output_config=hash_split_output(20),
            task="multi",
            near_duplicates="off",
        )
        written = read_examples(examples.uri)
        total = len(label_sets)
        assert len(written["eval"]) == pytest.approx(0.2 * total, abs=2), (case, len(written["eval"]))
        if case == "common":
            for label in ("dog", "cat"):
                having = sum(label in s.split(";") for s in label_sets)
                in_eval = sum(label.encode() in e["image/labels/text"] for e in written["eval"])
                assert in_eval == pytest.approx(0.2 * having, abs=max(3, 0.05 * having)), (label, in_eval, having)


def test_label_ids_given_dense_by_a_fixed_length_schema_make_the_same_multi_hot_as_sparse_ones():
    """SchemaGen gives a label feature a fixed length when every image has as many labels (500 labels on 60
    images, six each): the ids then come dense, and the multi-hot targets must not change (it was an
    AttributeError at the Trainer's export)."""
    import tensorflow as tf

    from trainer.features import LABELS_KEY, label_target

    dense = tf.constant([[0, 2], [1, -1], [4, 4]], tf.int64)  # -1: a name Transform did not know; 4: out of range
    sparse = tf.SparseTensor([[r, c] for r in range(3) for c in range(2)], tf.reshape(dense, [-1]), [3, 2])
    expected = [[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    for ids in (dense, sparse):
        np.testing.assert_array_equal(label_target({LABELS_KEY: ids}, 4, multi_label=True).numpy(), expected)
