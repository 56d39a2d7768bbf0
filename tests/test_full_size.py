"""Full-resolution photos: 12 MP files made at test time, through ingestion, TFDV, Transform and serving.

The benchmark (bench/photo_benchmark.py) measures speed and memory on thousands of
them; these tests pin the behaviour that makes those figures possible and keeps
the model consistent: DCT-scaled JPEG decoding, downscaled stored copies that keep
the original's size and hash, byte-bounded Beam batches, TFDV statistics that never
shuffle image bytes, and a serving signature that gives the evaluation path's
answer on the original full-size file.
"""

import hashlib
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from example_gen_helpers import by_filename, read_examples, run_executor, summary
from PIL import Image

from bench.photos import PHONE, photo
from pipeline import local_runner, platform
from pipeline.config import PipelineConfig

PHOTOS_PER_CLASS = 7


def sources():
    from sklearn.datasets import load_sample_images

    return load_sample_images().images  # china, flower: one class each


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory):
    """7 phone photos (4032x3024 JPEG, ~3.7 MB) per class, plus one 12 MP PNG in each class."""
    root = tmp_path_factory.mktemp("photos")
    images = sources()
    for c, label in enumerate(("china", "flower")):
        os.makedirs(root / label)
        for n in range(PHOTOS_PER_CLASS):
            data = photo(np.random.default_rng([c, n]), images[c])
            (root / label / f"IMG_{n:04d}.jpg").write_bytes(data)
        (root / label / "scan.png").write_bytes(photo(np.random.default_rng([c, 99]), images[c], fmt="PNG"))
    return str(root)


# --- decoding --------------------------------------------------------------------------------


def test_jpeg_scale_is_the_smallest_that_keeps_the_model_input_sharp():
    from images.decoding import JPEG_RATIOS, jpeg_scale_index

    def ratio(height, width, size):
        return JPEG_RATIOS[int(jpeg_scale_index(tf.constant(height), tf.constant(width), size))]

    assert ratio(3024, 4032, 64) == 8  # 378x504 still covers 64x64
    assert ratio(3024, 4032, 224) == 8  # 378 >= 224
    assert ratio(3024, 4032, 600) == 4  # 756 >= 600, 378 is not
    assert ratio(3024, 4032, 2000) == 1
    assert ratio(32, 32, 32) == 1  # small images decode as they are


def test_scaled_decode_matches_a_full_decode():
    """The DCT-scaled path gives the pixels a full decode + antialiased resize gives, within JPEG noise."""
    from images.decoding import decode_and_resize

    data = tf.constant(photo(np.random.default_rng(5), sources()[1]))
    full = tf.io.decode_image(data, channels=3, expand_animations=False)
    reference = tf.cast(tf.round(tf.image.resize(full, [224, 224], antialias=True)), tf.int32)
    scaled = tf.cast(decode_and_resize(data, 224, 3), tf.int32)
    assert scaled.shape == (224, 224, 3)
    assert float(tf.reduce_mean(tf.abs(scaled - reference))) < 2.5  # of 255
    png = tf.constant(photo(np.random.default_rng(5), sources()[1], size=(400, 300), fmt="PNG"))
    assert decode_and_resize(png, 64, 3).shape == (64, 64, 3)  # other formats decode at full size


# --- ingestion -------------------------------------------------------------------------------


def test_large_photos_are_stored_downscaled_with_the_original_size_and_hash(photo_dir, tmp_path):
    _, report = run_executor(photo_dir, tmp_path / "small", store_max_pixels=2_000_000)
    stored = by_filename(read_examples(str(tmp_path / "small" / "examples")))
    assert summary(report.uri)["downscaled"] == len(stored) == 2 * (PHOTOS_PER_CLASS + 1)
    for name, example in stored.items():
        original = open(os.path.join(photo_dir, name), "rb").read()
        width, height = example["image/width"], example["image/height"]
        assert (example["image/original/width"], example["image/original/height"]) == PHONE
        assert width * height <= 2_000_000 and abs(width / height - 4 / 3) < 0.01
        assert example["image/key/sha256"].decode() == hashlib.sha256(original).hexdigest()
        assert example["image/format"] == (b"png" if name.endswith(".png") else b"jpeg")
        decoded = tf.io.decode_image(example["image/encoded"], expand_animations=False)
        assert decoded.shape[:2] == (height, width)  # the features describe the stored bytes
        assert len(example["image/encoded"]) < len(original) / 3

    _, report = run_executor(photo_dir, tmp_path / "originals", store_max_pixels=0)
    kept = by_filename(read_examples(str(tmp_path / "originals" / "examples")))
    assert summary(report.uri)["downscaled"] == 0
    for name, example in kept.items():
        assert example["image/encoded"] == open(os.path.join(photo_dir, name), "rb").read()
        assert (example["image/width"], example["image/height"]) == PHONE


def _gradient(mode: str, fmt: str, size=(2000, 1500)) -> bytes:
    """A smooth colour picture in `mode`, encoded as `fmt` (resampling differences stay small)."""
    x, y = np.meshgrid(np.linspace(0, 1, size[0]), np.linspace(0, 1, size[1]))
    rgb = (np.stack([x, y, (x + y) / 2], axis=-1) * 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    if mode == "I;16":
        image = Image.fromarray((x * 65535).astype(np.uint16))
    elif mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize(
    "mode, fmt",
    [("RGB", "JPEG"), ("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("LA", "PNG"), ("I;16", "PNG"), ("P", "GIF")],
)
def test_downscaled_copies_decode_in_tensorflow_like_their_originals(mode, fmt):
    from images.image_check import check_and_store

    original = _gradient(mode, fmt)
    info, stored, stored_info = check_and_store(original, 50_000_000, 1_000_000)
    assert (info.width, info.height) == (2000, 1500)
    decoded = tf.io.decode_image(stored, expand_animations=False)
    assert decoded.shape == (stored_info.height, stored_info.width, stored_info.channels)
    assert stored_info.width * stored_info.height <= 1_000_000

    def model_view(data):
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        return tf.image.resize(image, [64, 64], antialias=True)

    assert float(tf.reduce_mean(tf.abs(model_view(original) - model_view(stored)))) < 2.0


# --- the libraries' settings -----------------------------------------------------------------


def test_tuned_components_batch_by_bytes_and_read_records_with_their_checksums(tmp_path):
    import apache_beam as beam
    from tfx_bsl.coders import batch_util

    from components import beam_settings
    from components.evaluator.executor import Executor as EvaluatorExecutor
    from components.transform.executor import TransformExecutor
    from components.validation.statistics import StatisticsGenExecutor
    from pipeline.pipeline import create_pipeline

    beam_settings.configure_beam()
    kwargs = batch_util.GetBatchElementsKwargs(None)
    assert kwargs["max_batch_size"] == beam_settings.TARGET_BATCH_BYTES == 20 << 20
    assert kwargs["element_size_fn"](b"x" * (3 << 20)) == 3 << 20  # a photo counts its bytes

    # Beam reads TFRecords written by TensorFlow, each CRC checked with the fast function.
    records = [os.urandom(n) for n in (1, 1000, 3 << 20)]
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for r in records:
            writer.write(r)
    out = str(tmp_path / "read")
    with beam.Pipeline() as p:
        _ = (
            p
            | beam.io.ReadFromTFRecord(path)
            | beam.Map(lambda r: hashlib.sha256(r).hexdigest())
            | beam.io.WriteToText(out, shard_name_template="")
        )
    assert sorted(open(out).read().split()) == sorted(hashlib.sha256(r).hexdigest() for r in records)

    config = PipelineConfig(root=str(tmp_path), model="cnn")
    pipeline = create_pipeline(config, platform.local(config))
    executors = {c.id: c.executor_spec.executor_class for c in pipeline.components if hasattr(c, "executor_spec")}
    assert executors["StatisticsGen"] is StatisticsGenExecutor
    assert executors["Transform"] is TransformExecutor
    # The Evaluator's own executor (class changes, data profile) is a tuned one too.
    assert executors["Evaluator"] is EvaluatorExecutor
    assert all(
        issubclass(e, beam_settings.BeamConfigured)
        for e in (StatisticsGenExecutor, TransformExecutor, EvaluatorExecutor)
    )


def test_a_batch_of_photos_tfma_hands_the_model_is_not_printed_byte_by_byte():
    """TFMA calls the serving signature positionally, and TensorFlow first writes the batch into a TypeError it then
    discards: while the Evaluator's TFMA runs, a string tensor prints each value's size; after it, as numpy would."""
    from components import beam_settings

    photos = tf.constant([b"\xff\xd8" + bytes(3 << 20), b"\x89PNG" + bytes(1000)])
    with beam_settings.bytes_printed_as_sizes():
        printed = repr(photos)
        in_message = str(TypeError(f"Received args: {(photos,)}"))  # what TensorFlow's binding error formats
    assert "<3,145,730 bytes>" in printed and "<1,004 bytes>" in printed and len(printed) < 300
    assert len(in_message) < 300
    assert len(repr(photos)) > 3 << 20  # numpy's own printing, given back


@pytest.mark.parametrize(
    "args, names",
    [
        (["--max-pixels", "2000000000"], "--max-pixels 2,000,000,000"),
        (["--store-max-pixels", "5000", "--image-size", "64"], "--store-max-pixels 5,000"),
    ],
)
def test_a_setting_that_cannot_fit_is_one_line_before_the_run(tmp_path, photo_dir, args, names):
    root = tmp_path / "root"
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "run", "--data", photo_dir, "--root", str(root), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], proc.stderr
    assert not root.exists()  # nothing written


# --- the whole DAG ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def photo_run(photo_dir, tmp_path_factory):
    # What the tests read is ingestion, statistics and the exported model's signatures: --model auto's comparison of
    # candidates (tests/test_held_out.py) and the explanations (tests/test_explanations.py) are left out.
    config = PipelineConfig(
        root=str(tmp_path_factory.mktemp("photo-run")),
        data=photo_dir,
        epochs=6,
        accuracy_threshold=0.0,
        auto_trial_minutes=0,
        explanations=0,
    )
    result = local_runner.run(config)
    return config, result


def _component(result, name):
    return next(c for c in result["components"] if c["component"] == name)


@pytest.mark.slow
def test_the_dag_runs_on_full_size_photos(photo_run):
    config, result = photo_run
    assert result["status"] == "complete"
    ingest = _component(result, "ImageExampleGen")
    report = summary(ingest["outputs"]["report"][0])
    assert report["downscaled"] == report["examples_written"] == 2 * (PHOTOS_PER_CLASS + 1)
    # TFDV describes the image bytes as bytes (lengths), never as categorical top values.
    from tensorflow_metadata.proto.v0 import statistics_pb2

    stats_dir = _component(result, "StatisticsGen")["outputs"]["statistics"][0]
    stats = statistics_pb2.DatasetFeatureStatisticsList()
    with open(os.path.join(stats_dir, "Split-train", "FeatureStats.pb"), "rb") as f:
        stats.ParseFromString(f.read())
    encoded = next(f for f in stats.datasets[0].features if f.path.step == ["image/encoded"])
    assert encoded.WhichOneof("stats") == "bytes_stats"
    # The stored copies: within the 2 MP budget's raw size, and a JPEG copy a tenth of its photo.
    assert encoded.bytes_stats.max_num_bytes < 3 * 2_000_000
    assert encoded.bytes_stats.min_num_bytes < 3_000_000 / 10


@pytest.mark.slow
def test_serving_full_size_bytes_agrees_with_the_evaluation_path(photo_run, photo_dir):
    """serving_default on the original file gives what serving_examples (the Evaluator's path) gives
    on the stored, downscaled example of the same photo."""
    _, result = photo_run
    model_dir = os.path.join(_component(result, "Trainer")["outputs"]["model"][0], "Format-Serving")
    model = tf.saved_model.load(model_dir)
    raw = read_serialized(_component(result, "ImageExampleGen")["outputs"]["examples"][0])
    names = sorted(raw)
    served = model.signatures["serving_default"](
        image_bytes=tf.constant([open(os.path.join(photo_dir, n), "rb").read() for n in names])
    )
    evaluated = model.signatures["serving_examples"](examples=tf.constant([raw[n] for n in names]))
    p_served, p_evaluated = served["probabilities"].numpy(), evaluated["probabilities"].numpy()
    assert np.abs(p_served - p_evaluated).max() < 0.05
    # Where the model is not on the fence: its class on the file is its class on the stored copy. (A model kept
    # from an early epoch is unconfident: on 4 eval photos, epoch 1 may already be right on all.)
    confident = np.abs(p_evaluated[:, 0] - p_evaluated[:, 1]) > 2 * np.abs(p_served - p_evaluated).max() + 0.01
    assert confident.sum() >= len(names) // 2  # the check below is not vacuous
    assert (served["predicted_class"].numpy()[confident] == evaluated["predicted_class"].numpy()[confident]).all()

    from prediction.image_inputs import expand_inputs
    from prediction.predict import classify

    answers = list(classify(model_dir, expand_inputs([os.path.join(photo_dir, n) for n in names])))
    assert [a["predictions"][0][0].encode() for a in answers] == list(served["predicted_class"].numpy())


def read_serialized(examples_uri):
    """{filename: serialized example} over every split."""
    files = tf.io.gfile.glob(os.path.join(examples_uri, "Split-*", "*.gz"))
    out = {}
    for record in tf.data.TFRecordDataset(sorted(files), compression_type="GZIP"):
        example = tf.train.Example.FromString(record.numpy())
        out[example.features.feature["image/filename"].bytes_list.value[0].decode()] = record.numpy()
    return out
