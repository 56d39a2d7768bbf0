"""Transfer learning through the features step: the whole DAG with a MobileNetV2 backbone (random weights,
BatchNorm calibrated, bench/backbones.py: nothing downloads). The frozen phase trains the head on features
computed once; the exported model, backbone and head in one SavedModel, serves what the head gave."""

import dataclasses
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import model_dir
from pipeline import local_runner
from pipeline.config import SAMPLE_SCHEMA, PipelineConfig
from trainer import features, models
from trainer.hparams import HParams

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)
SIZE = 32


def details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


def component(summary, name):
    return next(c for c in summary["components"] if c["component"] == name)


@pytest.fixture(scope="module")
def transfer_runs(tmp_path_factory, small_digits):
    """A run with the defaults of a transfer model, then one with --augment and a fine-tune epoch."""
    from bench.backbones import calibrated_weights

    files = sorted(glob.glob(os.path.join(small_digits, "*", "*")))[::5][:64]
    images = np.stack([np.asarray(Image.open(f).convert("RGB").resize((SIZE, SIZE))) for f in files])
    weights = calibrated_weights("mobilenet_v2", SIZE, images, str(tmp_path_factory.mktemp("w") / "w.weights.h5"))
    config = PipelineConfig(root=str(tmp_path_factory.mktemp("transfer")), data=small_digits, schema=SAMPLE_SCHEMA,
                            model="mobilenet_v2", image_size=SIZE, weights=weights, epochs=15, accuracy_threshold=0.0,
                            min_class_recall=0.0)  # weak features: blessed anyway, so the second run has a baseline
    plain = local_runner.run(config)
    tuned = local_runner.run(dataclasses.replace(config, augment="flip", fine_tune_epochs=1))
    return config, plain, tuned


def test_the_head_trains_on_features_computed_once(transfer_runs):
    config, plain, tuned = transfer_runs
    first = details(plain, "BackboneFeatures")
    assert (first["images"], first["computed"], first["reused"], first["dim"]) == (300, 300, 0, 1280)
    log = json.load(open(os.path.join(details(plain, "Trainer")["model_run"], "training.json")))
    assert log["features"] == {"fingerprint": first["fingerprint"], "dim": 1280, "views": {"train": 0, "eval": 0}}
    assert {e["phase"] for e in log["epochs"]} == {"frozen backbone"}
    evaluation = details(plain, "Evaluator")
    # The head learns from the features (chance is 0.1). Random (calibrated) backbone features at 32 px carry
    # little that generalises: the eval accuracy is 0.12-0.20 depending on which 60 digits are held out.
    assert max(e["sparse_categorical_accuracy"] for e in log["epochs"]) > 0.3
    assert evaluation["accuracy"] >= 0.1
    # The Evaluator scores the exported model (backbone and head) on raw images: what the head gave on features.
    assert details(plain, "Trainer")["kept_eval_accuracy"] == pytest.approx(
        evaluation["accuracy"], abs=1.01 / evaluation["example_count"])  # one image may round otherwise elsewhere

    # --augment: the cached plain features are reused, and 4 augmented views of each training image are
    # computed once; then a fine-tune epoch on pixels (read from the Transform output the features came from).
    second = details(tuned, "BackboneFeatures")
    train = details(plain, "ImageExampleGen")["examples_per_split"]["train"]
    assert second["views"] == {"train": 4, "eval": 0}
    assert (second["reused"], second["computed"]) == (300, 4 * train)
    log = json.load(open(os.path.join(details(tuned, "Trainer")["model_run"], "training.json")))
    phases = [e["phase"] for e in log["epochs"]]
    assert phases[-1] == "fine-tune" and phases.count("fine-tune") == 1 and phases[0] == "frozen backbone"
    assert details(tuned, "Evaluator")["accuracy"] is not None
    assert component(tuned, "Transform")["state"] == "cached"

    # Data health on the features: the label check is on by default (cheap here), and the second run
    # measures drift in feature space against the first model's data (the same images: none).
    health = details(plain, "DataHealth")
    assert health["examples"] == 300 and health["label_check_method"] == "5-fold logistic regression on backbone features"
    assert health["label_issue_fraction"] is not None and health.get("feature_drift") is None
    assert details(tuned, "DataHealth")["feature_drift"] == pytest.approx(0.0, abs=1e-3)


def test_the_exported_model_serves_what_the_head_gave_on_features(transfer_runs):
    config, plain, _ = transfer_runs
    source = json.load(open(os.path.join(component(plain, "BackboneFeatures")["outputs"]["features"][0],
                                         "source.json")))
    spec = {features.FEATURES_KEY: tf.io.FixedLenFeature([1280], tf.float32),
            features.KEY: tf.io.FixedLenFeature([], tf.string)}
    vectors = {}
    feature_files = glob.glob(os.path.join(component(plain, "BackboneFeatures")["outputs"]["features"][0],
                                           "Split-eval", "*"))
    for record in tf.data.TFRecordDataset(feature_files):  # the features step writes them uncompressed
        parsed = tf.io.parse_single_example(record, spec)
        vectors[parsed[features.KEY].numpy().decode()] = parsed[features.FEATURES_KEY].numpy()
    raw = {}
    example_files = glob.glob(os.path.join(component(plain, "ImageExampleGen")["outputs"]["examples"][0],
                                           "Split-eval", "*"))
    for record in tf.data.TFRecordDataset(example_files, compression_type="GZIP"):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        raw[feature["image/key/sha256"].bytes_list.value[0].decode()] = feature["image/encoded"].bytes_list.value[0]
    assert set(vectors) == set(raw) and len(raw) == details(plain, "ImageExampleGen")["examples_per_split"]["eval"]

    hp = HParams(model="mobilenet_v2", image_size=SIZE)
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
