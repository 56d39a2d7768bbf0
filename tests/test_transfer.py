"""Transfer learning through the features step, with the pretrained backbone: the whole DAG with its defaults on a
photo-like set the project makes (ten shapes on photo crops, bench/shapes.py), where --model auto takes
EfficientNet-Lite0 with its ImageNet weights from the installed package (nothing downloads). The frozen phase
trains the head on features computed once, and it learns: random weights give 0.13 on this set (measured with a
logistic regression on their features), the pretrained ones 0.76. The exported model, backbone and head in one
SavedModel, serves what the head gave."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import model_dir

from pipeline import local_runner
from pipeline.config import PipelineConfig
from trainer import features, models
from trainer.hparams import HParams

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)
PER_CLASS = 50


def details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


def component(summary, name):
    return next(c for c in summary["components"] if c["component"] == name)


def evaluation_section(summary) -> str:
    """The report's Evaluation section of a run."""
    from report import model_sections

    return model_sections.evaluation({c["component"]: c for c in summary["components"]})


def evaluated_on(summary) -> dict:
    """What the Evaluator scored: the heads on the features, or the serving models (evaluated_on.json)."""
    return details(summary, "Evaluator")["evaluated_on"]


@pytest.fixture(scope="module")
def transfer_runs(tmp_path_factory):
    """A run with every setting at its default on photo-like images (but the model comparison), then one with
    --augment and a fine-tune epoch, trained across three logical CPU devices (`--cpu-replicas 3`)."""
    from commands import run_imagepipe

    from bench.shapes import make_shapes
    from runs import run_summary

    data = make_shapes(str(tmp_path_factory.mktemp("shapes") / "images"), per_class=PER_CLASS, seed=3)
    # Every setting at its default but the blessing's bounds: the first model is blessed even if a class falls
    # short, so that the second run has a last blessed model to measure drift against.
    # --model auto's comparison with the cnn and fine-tuning (tests/test_held_out.py, test_model_trials.py) is left
    # out: this is the head on cached features.
    config = PipelineConfig(
        root=str(tmp_path_factory.mktemp("transfer")),
        data=data,
        accuracy_threshold=0.5,
        min_class_recall=0.0,
        auto_trial_minutes=0,
    )
    plain = local_runner.run(config)
    # The second run from the command line, as users start it: its logical devices must be made before TensorFlow
    # starts in its process. Explanations (14 s at 224 px on 2 cores) are the first run's default; this one asserts
    # its features, phases and replicas. Three epochs: what is tested is the phases and the batches, not learning.
    done = run_imagepipe(
        "run",
        "--root",
        config.root,
        "--data",
        config.data,
        "--accuracy-threshold",
        "0.5",
        "--min-class-recall",
        "0",
        "--auto-trial-minutes",
        "0",
        "--epochs",
        "3",
        "--augment",
        "flip",
        "--fine-tune-epochs",
        "1",
        "--explanations",
        "0",
        "--cpu-replicas",
        "3",
        "--progress",
        "quiet",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return config, plain, run_summary.summarize(config.metadata_path)


def test_the_head_trains_on_features_computed_once(transfer_runs):
    config, plain, tuned = transfer_runs
    trainer = details(plain, "Trainer")
    assert trainer["model"] == "efficientnet_lite0" and trainer["weights"] == "imagenet"
    assert trainer["model_choice"].startswith("photo-sized images, median shorter side 96 px")
    first = details(plain, "BackboneFeatures")
    images = 10 * PER_CLASS
    assert (first["images"], first["computed"], first["reused"], first["dim"]) == (images, images, 0, 1280)
    log = json.load(open(os.path.join(trainer["model_run"], "training.json")))
    assert log["features"] == {"fingerprint": first["fingerprint"], "dim": 1280, "views": {"train": 0, "eval": 0}}
    assert {e["phase"] for e in log["epochs"]} == {"frozen backbone"}
    assert log["hparams"]["image_size"] == 224
    # It learns, for every class: the pretrained features tell the ten shapes apart (chance 0.1; random weights'
    # features 0.13; measured here 0.80-0.86, its weakest class 0.44-0.6), on about ten eval images a class.
    evaluation = details(plain, "Evaluator")
    assert evaluation["accuracy"] >= 0.6, evaluation["accuracy"]
    recalls = {name: m["recall"] for name, m in evaluation["per_class"].items()}
    assert len(recalls) == 10 and min(recalls.values()) >= 0.2, recalls
    # The kept epoch's held-out accuracy (the head on features, in training) is what the model the operating point
    # was chosen for gives on the same held-out images, by plain calls.
    held = trainer["operating_point"]["model_on_held_out"]
    assert trainer["kept_eval_accuracy"] == pytest.approx(
        held["argmax"]["accuracy"], abs=1.01 / held["images"]
    )  # one image may round otherwise elsewhere
    # A head on cached features chooses its operating point on out-of-fold predictions of every train image.
    trained = details(plain, "ImageExampleGen")["examples_per_split"]["train"]
    assert trainer["operating_point"]["chosen_on"] == f"5-fold out-of-fold predictions of all {trained:,} train images"
    assert trainer["operating_point"]["held_out"]["images"] == trained

    # --augment: the cached plain features are reused, and 4 augmented views of each training image are
    # computed once; then a fine-tune epoch on pixels (read from the Transform output the features came from).
    second = details(tuned, "BackboneFeatures")
    train = details(plain, "ImageExampleGen")["examples_per_split"]["train"]
    assert second["views"] == {"train": 4, "eval": 0}
    assert (second["reused"], second["computed"]) == (10 * PER_CLASS, 4 * train)
    log = json.load(open(os.path.join(details(tuned, "Trainer")["model_run"], "training.json")))
    phases = [e["phase"] for e in log["epochs"]]
    assert phases[-1] == "fine-tune" and phases.count("fine-tune") == 1 and phases[0] == "frozen backbone"
    assert details(tuned, "Evaluator")["accuracy"] is not None
    # Fine-tuned, its backbone is no longer the features step's: the Evaluator runs the serving model on every image.
    on = evaluated_on(tuned)
    assert on["on"] == "serving model" and on["why"].startswith("the candidate has no head for these features"), on
    # The report says which, in one line.
    assert "Scored by the serving model on every eval image (the candidate has no head" in evaluation_section(tuned)
    assert "Scored by the model's head on the features step's features of every eval image" in evaluation_section(plain)
    assert component(tuned, "Transform")["state"] == "cached"

    # Data health on the features: the label check is on by default (cheap here), and the second run
    # measures drift in feature space against the first model's data (the same images: none).
    health = details(plain, "DataHealth")
    assert (
        health["examples"] == 10 * PER_CLASS
        and health["label_check_method"] == "5-fold logistic regression on backbone features"
    )
    assert health["label_issue_fraction"] is not None and health.get("feature_drift") is None
    assert details(tuned, "DataHealth")["feature_drift"] == pytest.approx(0.0, abs=1e-3)


def test_the_exported_model_serves_what_the_head_gave_on_features(transfer_runs):
    config, plain, _ = transfer_runs
    source = json.load(
        open(os.path.join(component(plain, "BackboneFeatures")["outputs"]["features"][0], "source.json"))
    )
    spec = {
        features.FEATURES_KEY: tf.io.FixedLenFeature([1280], tf.float32),
        features.KEY: tf.io.FixedLenFeature([], tf.string),
        features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    }
    vectors, records, labels = {}, {}, {}
    feature_files = glob.glob(
        os.path.join(component(plain, "BackboneFeatures")["outputs"]["features"][0], "Split-eval", "*")
    )
    for record in tf.data.TFRecordDataset(feature_files):  # the features step writes them uncompressed
        parsed = tf.io.parse_single_example(record, spec)
        key = parsed[features.KEY].numpy().decode()
        vectors[key], records[key] = parsed[features.FEATURES_KEY].numpy(), record.numpy()
        labels[key] = int(parsed[features.LABEL_KEY])
    raw = {}
    example_files = glob.glob(
        os.path.join(component(plain, "ImageExampleGen")["outputs"]["examples"][0], "Split-eval", "*")
    )
    for record in tf.data.TFRecordDataset(example_files, compression_type="GZIP"):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        raw[feature["image/key/sha256"].bytes_list.value[0].decode()] = feature["image/encoded"].bytes_list.value[0]
    assert set(vectors) == set(raw) and len(raw) == details(plain, "ImageExampleGen")["examples_per_split"]["eval"]

    hp = HParams(model="efficientnet_lite0", image_size=224)
    model = models.build(hp, 10, models.make_backbone(hp, source["backbone_weights"]))
    model.load_weights(os.path.join(model_dir(plain), "keras", "model.weights.h5"))
    kernel, bias = model.get_layer("probabilities").get_weights()
    keys = sorted(raw)
    logits = np.stack([vectors[k] for k in keys]) @ kernel + bias
    head = np.exp(logits - logits.max(axis=1, keepdims=True))
    head /= head.sum(axis=1, keepdims=True)
    serve = tf.saved_model.load(os.path.join(model_dir(plain), "Format-Serving")).signatures["serving_default"]
    served = serve(image_bytes=tf.constant([raw[k] for k in keys]))["probabilities"].numpy()
    # The backbone as served (pixels in) against the head on the cached features: oneDNN's rounding differs by
    # batch size and CPU; probabilities agree to 1e-3 anywhere, and a wrong graph misses by far more.
    np.testing.assert_allclose(served, head, atol=1e-3)

    # So the Evaluator scored the head the Trainer exported on its own, on these features, once the serving model
    # agreed with it on the first eval images (components/evaluator/on_features.py): its accuracy is the served
    # model's on every eval image (an argmax that a 1e-6 difference could flip: one image at most).
    exported = tf.saved_model.load(os.path.join(model_dir(plain), "features_head", "Format-Serving"))
    by_head = exported.signatures["serving_examples"](examples=tf.constant([records[k] for k in keys]))
    np.testing.assert_allclose(by_head["probabilities"].numpy(), head, rtol=1e-5, atol=1e-6)
    on = evaluated_on(plain)
    assert on["on"] == "features" and on["agreement_images"] == 32 and on["largest_difference"] <= 1e-3, on
    accuracy = float(np.mean(served.argmax(axis=1) == np.array([labels[k] for k in keys])))
    assert details(plain, "Evaluator")["accuracy"] == pytest.approx(accuracy, abs=1.01 / len(keys))


def test_a_fine_tuned_model_is_scored_on_one_pass_of_its_serving_model(transfer_runs):
    """Fine-tuned, the kept model has no head for the features: its serving model runs once over the eval images
    into prediction records (components/evaluator/predictions.py), and TFMA and the misclassified record read them.
    Each record holds what the serving model gives that image (within the agreement bound, where its Keras model ran
    on ONNX Runtime), its label is the model's id for the image's class, and the Evaluator's accuracy is the served
    argmax's on every eval image."""
    from components.evaluator import misclassified
    from components.evaluator.on_features import AGREEMENT_TOLERANCE
    from components.features import runtimes
    from images import feature_keys as keys

    _, plain, tuned = transfer_runs
    eval_images = details(tuned, "ImageExampleGen")["examples_per_split"]["eval"]
    on = evaluated_on(tuned)
    assert on["on"] == "serving model" and on["scored_from"] == "prediction records", on
    assert on["predictions"]["images"] == {"eval": eval_images} and on["predictions"]["seconds"] > 0
    # Without an accelerator its Keras model runs on ONNX Runtime, once it agreed with the serving model on a batch
    ran = on["predictions"]["models"]["candidate"]
    accelerated = bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
    assert ran["runtime"] == (runtimes.TENSORFLOW if accelerated else runtimes.ONNX), ran
    assert accelerated or ran["largest_difference"] <= AGREEMENT_TOLERANCE, ran
    evaluation = component(tuned, "Evaluator")["outputs"]["evaluation"][0]
    spec = {
        features.KEY: tf.io.FixedLenFeature([], tf.string),
        features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        "candidate/probabilities": tf.io.FixedLenFeature([10], tf.float32),
    }
    predicted = [
        tf.io.parse_single_example(r, spec)
        for r in _records(os.path.join(evaluation, "predictions", "records", "Split-eval"))
    ]
    raw = _records(os.path.join(component(tuned, "ImageExampleGen")["outputs"]["examples"][0], "Split-eval"))
    assert [p[features.KEY].numpy() for p in predicted] == [_parsed(r)[1] for r in raw]  # every image, in order

    info = json.load(open(os.path.join(model_dir(tuned), "keras", "model_info.json")))
    names = [tf.train.Example.FromString(r).features.feature[keys.LABEL_TEXT].bytes_list.value[0].decode() for r in raw]
    labels = np.array([info["class_names"].index(n) for n in names])
    assert [int(p[features.LABEL_KEY]) for p in predicted] == labels.tolist()
    serving = tf.saved_model.load(os.path.join(model_dir(tuned), "Format-Serving")).signatures["serving_examples"]
    served = serving(examples=tf.constant(raw))["probabilities"].numpy()
    recorded = np.stack([p["candidate/probabilities"].numpy() for p in predicted])
    # within the bound ONNX Runtime is held to (measured here: 2e-6 to 6e-6; TensorFlow's own rounding differs by
    # batch size too)
    np.testing.assert_allclose(recorded, served, atol=AGREEMENT_TOLERANCE)
    accuracy = float(np.mean(served.argmax(axis=1) == labels))
    assert details(tuned, "Evaluator")["accuracy"] == pytest.approx(accuracy, abs=1.01 / eval_images)
    # The misclassified record's classes and probabilities are the records' (no model ran for them).
    listed = misclassified.read(evaluation)["images"]
    assert len(listed) == min(misclassified.MOST, int(np.sum(recorded.argmax(axis=1) != labels))) > 0
    by_path = {_parsed(r)[0]: p for r, p in zip(raw, recorded)}
    for image in listed:
        assert image["predicted"] == info["class_names"][int(by_path[image["path"]].argmax())]
        assert image["probability"] == pytest.approx(float(by_path[image["path"]].max()), rel=1e-5)


def test_the_head_trains_across_three_replicas(transfer_runs):
    """`--cpu-replicas 3` (the second run): the features' last batches split unevenly over the replicas, which Keras 3
    failed to add up ("AddN ... [27,1280] != [26,1280]"); every batch now has one shape (the eval batch padded with
    weightless examples), and the run trains, fine-tunes and is scored as on one replica."""
    _, _, tuned = transfer_runs
    trainer = details(tuned, "Trainer")
    # --epochs 3 on the features, then the fine-tune epoch
    assert trainer["strategy"].startswith("multi-cpu (3 replicas") and trainer["epochs"] == 3 + 1
    evaluation = details(tuned, "Evaluator")
    # The padding counts nowhere: the Trainer's held-out accuracy (padded batches over 3 replicas) is what plain
    # calls of the same model give on the same held-out images (unpadded).
    held = trainer["operating_point"]["model_on_held_out"]
    assert evaluation["example_count"] > 0
    assert trainer["kept_eval_accuracy"] == pytest.approx(held["argmax"]["accuracy"], abs=1.01 / held["images"])


def _evaluator_inputs(summary):
    """The Evaluator's inputs in a run (the eval images, the features, the candidate) and its serving model's path."""
    from tfx.types import artifact_utils, standard_artifacts
    from tfx.utils import path_utils

    examples = standard_artifacts.Examples()
    examples.uri = component(summary, "ImageExampleGen")["outputs"]["examples"][0]
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    computed = standard_artifacts.Examples()
    computed.uri = component(summary, "BackboneFeatures")["outputs"]["features"][0]
    computed.split_names = examples.split_names
    candidate = standard_artifacts.Model()
    candidate.uri = model_dir(summary)
    inputs = {"examples": [examples], "features": [computed], "model": [candidate]}
    return inputs, path_utils.serving_model_path(candidate.uri)


def test_the_evaluator_loads_the_serving_model_once_and_classifies_eval_images_with_the_head_it_scored(
    transfer_runs, tmp_path, monkeypatch
):
    """The Evaluator runs the candidate's serving model against its head on the first eval images (on_features) and
    over the eval images for the report (the misclassified ones, the explanations' sample). It loads it once for both
    (executor.ServingModelLoader); where TFMA scored the head on the features, that pass takes each image's class from
    the head on its feature record (on_features.head_scores), not from the backbone run again: the same agreement, the
    same images listed and explained, in the same order, as with a load each and the serving model classifying, each
    probability the head's (within the agreement tolerance of the serving model's)."""
    from components.evaluator import explanations, on_features
    from components.evaluator.executor import ServingModelLoader

    inputs, serving = _evaluator_inputs(transfer_runs[1])
    examples = inputs["examples"][0].uri
    _, apart = on_features.choose(inputs, ["eval"])
    by_serving = explanations.explain_eval(serving, examples, str(tmp_path / "serving"), 2)

    loaded, load_model = [], tf.saved_model.load
    monkeypatch.setattr(tf.saved_model, "load", lambda path, *a, **k: loaded.append(path) or load_model(path, *a, **k))
    load = ServingModelLoader(serving)
    scored, shared = on_features.choose(inputs, ["eval"], load)
    scores = on_features.head_scores(scored, load)
    by_head = explanations.explain_eval(serving, examples, str(tmp_path / "head"), 2, load=load, scores=scores)
    assert loaded.count(serving) == 1 and len(loaded) == 3, loaded  # the serving model once; its head (small) twice
    assert shared == apart and shared["on"] == "features"

    def listed(found, part):
        return [(i["path"], i["actual"], i["predicted"]) for i in found[part]["images"]]

    for part in ("misclassified", "explanations"):
        assert listed(by_head, part) == listed(by_serving, part) and listed(by_head, part), part
        assert [i["probability"] for i in by_head[part]["images"]] == pytest.approx(
            [i["probability"] for i in by_serving[part]["images"]], abs=on_features.AGREEMENT_TOLERANCE
        )
    assert by_head["misclassified"]["examined"] == by_serving["misclassified"]["examined"] > 0
    # ... and the head's own figures: what its signature gives on the image's feature record (a 256-record batch
    # there, one record here: ~2e-7 apart)
    head = tf.saved_model.load(os.path.join(scored["model"][0].uri, "Format-Serving")).signatures["serving_examples"]
    first = by_head["misclassified"]["images"][0]
    key = next(
        key for path, key in map(_parsed, _records(os.path.join(examples, "Split-eval"))) if path == first["path"]
    )
    feature = next(r for r in _records(os.path.join(inputs["features"][0].uri, "Split-eval")) if _feature_key(r) == key)
    probabilities = head(examples=tf.constant([feature]))["probabilities"].numpy()[0]
    assert first["probability"] == pytest.approx(probabilities.max(), rel=1e-5)
    assert scores([key])[0] == (int(probabilities.argmax()), pytest.approx(probabilities.max(), rel=1e-5))


def _records(folder):
    files = sorted(glob.glob(os.path.join(folder, "*")))
    return [r.numpy() for r in tf.data.TFRecordDataset(files, features.compression(files))]


def _parsed(record):
    from images import feature_keys as keys

    example = tf.train.Example.FromString(record).features.feature
    return example[keys.FILENAME].bytes_list.value[0].decode(), example[keys.SHA256].bytes_list.value[0]


def _feature_key(record):
    return tf.train.Example.FromString(record).features.feature[features.KEY].bytes_list.value[0]


def test_a_head_that_disagrees_with_its_serving_model_is_not_what_the_evaluator_scores(transfer_runs, tmp_path):
    from tfx.types import artifact_utils, standard_artifacts

    from components.evaluator import on_features
    from trainer import head_export

    _, plain, _ = transfer_runs
    features_uri = component(plain, "BackboneFeatures")["outputs"]["features"][0]
    examples_uri = component(plain, "ImageExampleGen")["outputs"]["examples"][0]
    model = tmp_path / "model"
    shutil.copytree(model_dir(plain), model)

    def artifacts(kind, uri):
        artifact = kind()
        artifact.uri = str(uri)
        if kind is standard_artifacts.Examples:
            artifact.split_names = artifact_utils.encode_split_names(["train", "eval"])
        return [artifact]

    inputs = {
        "examples": artifacts(standard_artifacts.Examples, examples_uri),
        "features": artifacts(standard_artifacts.Examples, features_uri),
        "model": artifacts(standard_artifacts.Model, model),
    }
    scored, record = on_features.choose(inputs, ["eval"])
    assert record["on"] == "features" and record["largest_difference"] <= 1e-3
    assert (scored["examples"][0].uri, scored["model"][0].uri) == (features_uri, str(model / "features_head"))
    assert inputs["model"][0].uri == str(model) and "features" not in scored  # the candidate's own artifact kept

    # Another head under the same fingerprint (weights the serving model does not have): the serving model is scored.
    hp = HParams(model="efficientnet_lite0", image_size=224)
    source = json.load(open(os.path.join(features_uri, "source.json")))
    head_export.export_head(models.head(10, 1280, hp), hp, 10, source, str(model))
    scored, record = on_features.choose(inputs, ["eval"])
    assert record["on"] == "serving model" and record["largest_difference"] > 1e-3, record
    assert record["why"].startswith("the serving model and its head disagree by ")
    assert (scored["examples"][0].uri, scored["model"][0].uri) == (examples_uri, str(model))
    # As the last blessed model beside a candidate that agrees (it may have been scored on its serving model): the same.
    compared = {
        **inputs,
        "model": artifacts(standard_artifacts.Model, model_dir(plain)),
        "baseline_model": inputs["model"],
    }
    scored, record = on_features.choose(compared, ["eval"])
    assert record["on"] == "serving model" and record["largest_difference"] > 1e-3, record
    assert scored["baseline_model"][0].uri == str(model) and scored["examples"][0].uri == examples_uri
