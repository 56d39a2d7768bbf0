"""Transform's preprocessing_fn (through TFT's Beam implementation), the input pipeline,
strategy selection and the models, on real images and real records."""

import dataclasses
import io
import os
import shutil
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from conftest import image_bytes
from PIL import Image
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

from components.transform.preprocessing import preprocessing_fn
from trainer import artifact_files, features, holdout, input_pipeline, models, strategy
from trainer.hparams import HParams
from trainer.training import seconds_per_batch_read

SIZE = 16


def _raw(data: bytes, label: str):
    return {features.IMAGE_KEY: [data], features.LABEL_TEXT_KEY: [label.encode()]}


@pytest.fixture(scope="module")
def transformed(tmp_path_factory):
    """Real images of every format through AnalyzeAndTransformDataset."""
    images = [
        (image_bytes("JPEG", size=(40, 30), seed=1), "cat"),
        (image_bytes("PNG", size=(30, 40), mode="L", seed=2), "cat"),
        (image_bytes("GIF", size=(20, 20), seed=3), "dog"),
        (image_bytes("BMP", size=(25, 25), seed=4), "cat"),
        (image_bytes("JPEG", size=(50, 20), mode="CMYK", seed=5), "bird"),
        (image_bytes("PNG", size=(16, 16), mode="RGBA", seed=6), "dog"),
    ]
    spec = {
        features.IMAGE_KEY: tf.io.FixedLenFeature([1], tf.string),
        features.LABEL_TEXT_KEY: tf.io.FixedLenFeature([1], tf.string),
    }
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
    temp = str(tmp_path_factory.mktemp("tft"))
    out = str(tmp_path_factory.mktemp("transform_fn"))
    config = HParams(model="cnn", image_size=SIZE).to_custom_config()
    with tft_beam.Context(temp_dir=temp, force_tf_compat_v1=False):
        (rows, _), transform_fn = (
            [_raw(d, label) for d, label in images],
            metadata,
        ) | tft_beam.AnalyzeAndTransformDataset(lambda inputs: preprocessing_fn(inputs, config))
        _ = transform_fn | tft_beam.WriteTransformFn(out)
    metadata_io.write_metadata(metadata, os.path.join(out, tft.TFTransformOutput.RAW_METADATA_DIR))  # as TFX does
    return images, rows, tft.TFTransformOutput(out)


def test_preprocessing_decodes_every_format_to_fixed_size_uint8(transformed):
    images, rows, _ = transformed
    assert len(rows) == len(images)
    for (data, _), row in zip(images, rows):
        pixels = features.decode_pixels(tf.constant([row[features.PIXELS_KEY]]), SIZE, 3).numpy()[0]
        assert pixels.shape == (SIZE, SIZE, 3)
        assert 0 <= pixels.min() and pixels.max() <= 255
        # The same picture as Pillow's own resize of the decoded image (within resampling differences).
        reference = np.asarray(
            Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR), dtype=np.float32
        )
        assert np.abs(pixels - reference).mean() < 40


def test_materialised_pixels_are_one_byte_each(transformed):
    _, rows, _ = transformed
    assert {len(row[features.PIXELS_KEY]) - SIZE * SIZE * 3 for row in rows} < set(range(1, 40))


def test_label_vocabulary_comes_from_the_data(transformed):
    images, rows, output = transformed
    vocabulary = [v.decode() for v in output.vocabulary_by_name(features.LABEL_VOCABULARY)]
    assert sorted(vocabulary) == ["bird", "cat", "dog"]
    for (_, label), row in zip(images, rows):
        assert vocabulary[row[features.LABEL_KEY]] == label


def _write_transformed(path, count, size=SIZE, seed=0):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(count, size, size, 3), dtype=np.uint8)
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for i in range(count):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        features.PIXELS_KEY: tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[tf.io.serialize_tensor(pixels[i]).numpy()])
                        ),
                        features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    return pixels


def test_input_pipeline_batches_parse_every_record(tmp_path):
    shards = [_write_transformed(str(tmp_path / f"part-{n}.gz"), 25, seed=n) for n in range(3)]
    hp = HParams(model="cnn", image_size=SIZE, batch_size=16, seed=7)
    evaluation = list(input_pipeline.make_dataset([str(tmp_path / "*.gz")], hp, training=False))
    assert [len(y) for _, y in evaluation] == [16, 16, 16, 16, 11]  # 75 records, nothing dropped
    images = np.concatenate([x.numpy() for x, _ in evaluation])
    assert images.dtype == np.float32 and images.shape == (75, SIZE, SIZE, 3)
    # Pixels survive exactly (records from the three shards are interleaved).
    assert sorted(im.astype(np.uint8).tobytes() for im in images) == sorted(
        im.tobytes() for shard in shards for im in shard
    )

    def labels(seed):
        d = input_pipeline.make_dataset(
            [str(tmp_path / "*.gz")], HParams(model="cnn", image_size=SIZE, batch_size=16, seed=seed), training=True
        )
        return np.concatenate([y.numpy() for _, y in d])

    assert sorted(labels(7)) == sorted(np.concatenate([y.numpy() for _, y in evaluation]))
    np.testing.assert_array_equal(labels(7), labels(7))  # seeded shuffle is reproducible


def _write_class_sorted(path, classes, per_class, size=SIZE, seed=0):
    """Records as Transform writes them for class-folder data read in order: one file, one class after
    another. Class k is a grey level of its own (16 apart), under noise: learnt in an epoch when the
    batches mix the classes, but only in relation to each other."""
    rng = np.random.default_rng(seed)
    palette = np.repeat(64 + 16 * np.arange(classes)[:, None], 3, axis=1)
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for label in range(classes):
            for _ in range(per_class):
                noise = rng.integers(-40, 41, size=(size, size, 3))
                pixels = np.clip(palette[label] + noise, 0, 255).astype(np.uint8)
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            features.PIXELS_KEY: tf.train.Feature(
                                bytes_list=tf.train.BytesList(value=[tf.io.serialize_tensor(pixels).numpy()])
                            ),
                            features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        }
                    )
                )
                writer.write(example.SerializeToString())


def test_training_batches_mix_every_class_from_the_first_batch(tmp_path):
    """A class-sorted file bigger than any fixed buffer: the first batches hold each class in about its
    share (each count is Binomial(320, 1/10) under a uniform shuffle: mean 32, sd 5.4; bounds at ~4 sd)."""
    _write_class_sorted(str(tmp_path / "part.gz"), classes=10, per_class=600, size=8)
    hp = HParams(model="cnn", image_size=8, batch_size=64, seed=3)
    batches = input_pipeline.make_dataset([str(tmp_path / "part.gz")], hp, training=True).take(5)
    labels = np.concatenate([y.numpy() for _, y in batches])
    counts = np.bincount(labels, minlength=10)
    assert len(labels) == 320 and counts.min() >= 12 and counts.max() <= 55, counts


def test_one_epoch_on_class_sorted_records_learns_well_above_chance(tmp_path):
    _write_class_sorted(str(tmp_path / "train.gz"), classes=8, per_class=800)
    _write_class_sorted(str(tmp_path / "eval.gz"), classes=8, per_class=25)
    hp = HParams(model="cnn", image_size=SIZE, batch_size=64, seed=5)
    keras.utils.set_random_seed(hp.seed)
    model = models.build(hp, num_classes=8)
    models.compile_model(model, hp)
    model.fit(input_pipeline.make_dataset([str(tmp_path / "train.gz")], hp, training=True), epochs=1, verbose=0)
    _, accuracy, *_ = model.evaluate(
        input_pipeline.make_dataset([str(tmp_path / "eval.gz")], hp, training=False), verbose=0
    )
    # Chance is 0.125 (measured: 0.875 shuffled over the whole set; 0.25 with the fixed 2,048-record buffer,
    # which fed the epoch two or three classes at a time).
    assert accuracy > 0.6


def test_shuffle_buffer_is_sized_from_the_data():
    hp = HParams(model="cnn", cache_megabytes=40, batch_size=64)
    assert input_pipeline.shuffle_buffer(10_000, 30.0, cached=True, hp=hp) == 10_000  # cached: the whole set
    # Not cached: as many records as a quarter of the cache budget holds (10 MB of 10 kB records).
    assert input_pipeline.shuffle_buffer(10_000, 100.0, cached=False, hp=hp) == 1_000
    assert input_pipeline.shuffle_buffer(10_000, 100_000.0, cached=False, hp=hp) == 64  # at least a batch
    assert input_pipeline.shuffle_buffer(0, 0.0, cached=False, hp=hp) == 1


def test_features_past_the_cache_budget_stream_through_a_bounded_buffer(tmp_path):
    """The head's features were always cached in memory (out of memory near 2.5 million images): past the budget
    they stream from shuffled files through a bounded buffer, every record once an epoch, as pixels do."""
    from components.features.executor import feature_example

    dim, count = 8, 600
    for shard in range(3):
        with tf.io.TFRecordWriter(str(tmp_path / f"features-{shard}.tfrecord")) as writer:
            for n in range(shard, count, 3):
                writer.write(feature_example(np.full(dim, n, np.float32), n % 4, f"{n:04d}".encode()))
    for budget, cached in ((100, True), (0.01, False)):  # megabytes (the records are ~30 kB in all)
        hp = HParams(model="efficientnet_lite0", cache_megabytes=budget, batch_size=50, seed=2)
        assert (input_pipeline.measure(input_pipeline.list_files([str(tmp_path / "*")]))[1] <= budget) == cached
        dataset = input_pipeline.make_feature_dataset(
            [str(tmp_path / "*")], hp, {"dim": dim, "views": {}}, training=True
        )
        seen = np.concatenate([x[:, 0].numpy() for x, _ in dataset]).astype(int)
        assert sorted(seen.tolist()) == list(range(count)) and seen.tolist() != sorted(seen.tolist())


def test_records_read_once_serve_every_dataset_built_on_them(tmp_path):
    """The Tuner's trials share one count and one in-memory copy of a split (input_pipeline.read_records): after
    the first dataset's whole pass, the next ones (another batch size, another shuffle) read no file, and see
    every record. Past the cache budget nothing is held, and each dataset streams from the files."""
    from components.features.executor import feature_example

    os.makedirs(tmp_path / "pixels")
    _write_transformed(str(tmp_path / "pixels" / "part-0.gz"), 40)
    dim, count = 4, 90
    os.makedirs(tmp_path / "features")
    with tf.io.TFRecordWriter(str(tmp_path / "features" / "part-0.tfrecord")) as writer:
        for n in range(count):
            writer.write(feature_example(np.full(dim, n, np.float32), n % 3, f"{n:04d}".encode()))
    hp = HParams(model="cnn", image_size=SIZE, batch_size=16, seed=3)
    pixels = input_pipeline.read_records([str(tmp_path / "pixels" / "*")], hp)
    features_read = input_pipeline.read_records([str(tmp_path / "features" / "*")], hp)
    assert (pixels.count, features_read.count) == (40, 90) and pixels.in_memory is not None
    first = input_pipeline.make_dataset([], hp, training=True, shared_records=pixels)
    assert sum(len(y) for _, y in first) == 40
    seen = lambda d: sorted(np.concatenate([x[:, 0].numpy() for x, _ in d]).astype(int).tolist())  # noqa: E731
    assert seen(
        input_pipeline.make_feature_dataset(
            [], hp, {"dim": dim, "views": {}}, training=False, shared_records=features_read
        )
    ) == list(range(count))
    shutil.rmtree(tmp_path / "pixels")
    shutil.rmtree(tmp_path / "features")  # every later dataset reads the copy in memory
    for batch_size in (8, 32):
        again = input_pipeline.make_dataset(
            [], dataclasses.replace(hp, batch_size=batch_size), training=True, shared_records=pixels
        )
        assert [len(y) for _, y in again][:1] == [batch_size] and sum(len(y) for _, y in again) == 40
        trial = input_pipeline.make_feature_dataset(
            [],
            dataclasses.replace(hp, batch_size=batch_size),
            {"dim": dim, "views": {}},
            training=True,
            shared_records=features_read,
        )
        assert seen(trial) == list(range(count))
    small = HParams(model="cnn", image_size=SIZE, cache_megabytes=0.001)
    _write_transformed(str(tmp_path / "streamed.gz"), 10)
    assert input_pipeline.read_records([str(tmp_path / "streamed.gz")], small).in_memory is None


@pytest.mark.parametrize("kind", ["flip", "crop", "brightness"])
def test_each_augmentation_changes_images_and_keeps_shapes_and_range(kind):
    images = tf.constant(np.random.default_rng(0).integers(0, 256, size=(16, SIZE, SIZE, 3)), tf.float32)
    out = input_pipeline.augment(images, HParams(model="cnn", image_size=SIZE, augment=kind, seed=3))
    assert out.shape == images.shape and float(tf.reduce_min(out)) >= 0 and float(tf.reduce_max(out)) <= 255
    changed = [not np.array_equal(a, b) for a, b in zip(out.numpy(), images.numpy())]
    assert 0 < sum(changed), kind  # an augment() that returned its input fails here
    if kind == "flip":  # each image is either itself or its mirror
        for a, b in zip(out.numpy(), images.numpy()):
            assert np.array_equal(a, b) or np.array_equal(a, b[:, ::-1])
    if kind == "brightness":  # one shift per image, clipped to the pixel range
        shift = (out - images).numpy()
        unclipped = (images.numpy() > 30) & (images.numpy() < 225)
        assert all(np.ptp(d[m]) < 1e-3 for d, m in zip(shift, unclipped))
    assert (
        input_pipeline.augment(images, HParams(model="cnn", image_size=SIZE, augment="")) is images
    )  # none asked: untouched


def test_training_input_applies_augmentation(tmp_path):
    _write_transformed(str(tmp_path / "part.gz"), 8)
    plain, augmented = (
        next(
            iter(
                input_pipeline.make_dataset(
                    [str(tmp_path / "part.gz")],
                    HParams(model="cnn", image_size=SIZE, batch_size=8, augment=a, seed=5),
                    training=True,
                )
            )
        )[0]
        for a in ("", "flip,crop,brightness")
    )
    assert augmented.shape == (8, SIZE, SIZE, 3) and not np.array_equal(plain.numpy(), augmented.numpy())


def test_no_records_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no transformed records"):
        input_pipeline.make_dataset([str(tmp_path / "*.gz")], HParams(), training=True)


def test_strategy_on_this_machine_follows_the_rule():
    """TPU, then several GPUs, then one GPU or the CPU: checked against what this machine has."""
    from conftest import expected_strategy_kind

    chosen = strategy.plan()
    kind = expected_strategy_kind()
    assert chosen.kind == kind
    assert (
        chosen.mixed_precision_policy
        == {"cpu": None, "gpu": "mixed_float16", "multi-gpu": "mixed_float16", "tpu": "mixed_bfloat16"}[kind]
    )
    if kind != "tpu":
        gpus = len(tf.config.list_logical_devices("GPU"))
        assert strategy.make(chosen).num_replicas_in_sync == (gpus if kind == "multi-gpu" else 1)


def test_strategy_selection_order_with_faked_devices():
    def no_tpu():
        raise ValueError("Please provide a TPU Name to connect to.")

    tpu = strategy.plan(tpu_resolver=lambda: "resolver", gpus=["/gpu:0", "/gpu:1"])
    assert (tpu.kind, tpu.mixed_precision_policy, tpu.tpu_resolver) == ("tpu", "mixed_bfloat16", "resolver")
    multi = strategy.plan(tpu_resolver=no_tpu, gpus=["/gpu:0", "/gpu:1"])
    assert (multi.kind, multi.devices, multi.mixed_precision_policy) == (
        "multi-gpu",
        ["/gpu:0", "/gpu:1"],
        "mixed_float16",
    )
    one = strategy.plan(gpus=["/gpu:0"], mixed_precision="off")
    assert (one.kind, one.mixed_precision_policy) == ("gpu", None)
    assert strategy.plan(gpus=[], mixed_precision="on").mixed_precision_policy == "mixed_bfloat16"


def test_tpu_is_only_probed_when_one_may_exist():
    assert not strategy.tpu_may_exist({}) or os.path.exists("/dev/accel0")
    assert strategy.tpu_may_exist({"TPU_NAME": "my-tpu"})


# The pretrained backbone with its ImageNet weights (installed); the keras.applications ones with random weights
# (theirs would be downloaded): what is tested here is which weights each phase trains.
@pytest.mark.parametrize(
    "name,weights",
    [
        ("efficientnet_lite0", "imagenet"),
        ("mobilenet_v2", ""),
        pytest.param("efficientnet_b0", "", marks=pytest.mark.slow),
    ],
)
def test_transfer_models_train_in_two_phases(name, weights, tmp_path):
    hp = HParams(model=name, image_size=32, weights=weights, learning_rate=0.01)
    model = models.build(hp, num_classes=3)
    backbone = models.backbone_of(model)
    assert not backbone.trainable and not backbone.trainable_weights
    assert model.output_shape == (None, 3)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 255, size=(16, 32, 32, 3)).astype("float32"), rng.integers(0, 3, size=16)

    def snapshot():
        return [w.numpy().copy() for w in backbone.weights], [w.numpy().copy() for w in model.layers[-1].weights]

    # Phase 1: the backbone is frozen, the head learns.
    models.compile_model(model, hp)
    # Which weights a step changes is the same traced or not; tracing these backbones took most of the test (the
    # three: 33 s traced, 9 s eager)
    model.run_eagerly = True
    before_backbone, before_head = snapshot()
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    after_backbone, after_head = snapshot()
    assert all(np.array_equal(a, b) for a, b in zip(before_backbone, after_backbone))
    assert any(not np.array_equal(a, b) for a, b in zip(before_head, after_head))

    # Phase 2: the top layers of the backbone are unfrozen (never BatchNormalization) and learn too.
    unfrozen = models.unfreeze_top(model, 10)
    assert 0 < unfrozen <= 10
    trainable = [layer for layer in backbone.layers if layer.trainable_weights]
    assert trainable and all(not isinstance(layer, keras.layers.BatchNormalization) for layer in trainable)
    models.compile_model(
        model, dataclasses.replace(hp, fine_tune_learning_rate=hp.fine_tune_learning_rate * 1000), fine_tuning=True
    )
    model.run_eagerly = True
    tuned_before = [w.numpy().copy() for layer in trainable for w in layer.trainable_weights]
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    tuned_after = [w.numpy() for layer in trainable for w in layer.trainable_weights]
    assert any(not np.array_equal(a, b) for a, b in zip(tuned_before, tuned_after))


@pytest.mark.parametrize("scheme", ["", "file://"])  # file:// goes the way gs:// does: copied locally first
def test_backbone_weights_load_from_a_file(tmp_path, scheme, monkeypatch):
    source = keras.applications.MobileNetV2(input_shape=(32, 32, 3), include_top=False, weights=None)
    path = str(tmp_path / "mobilenet_v2_notop.weights.h5")
    source.save_weights(path)
    staging = tmp_path / "tmp"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    model = models.build(HParams(model="mobilenet_v2", image_size=32, weights=scheme + path), num_classes=2)
    loaded = models.backbone_of(model).get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(loaded, source.get_weights()))
    assert not list(staging.iterdir())  # the local copy of remote weights is gone once they are loaded


def test_warm_start_loads_only_a_matching_base_model(tmp_path):
    """Same classes and input: the weights are loaded; otherwise training starts from scratch, saying why."""
    import json

    from trainer import task

    hp = HParams(model="cnn", image_size=SIZE)
    info = {"class_names": ["cat", "dog"], "model": "cnn", "image_size": SIZE, "channels": 3}
    base = models.build(hp, num_classes=2)
    serving = tmp_path / "model" / "Format-Serving"
    serving.mkdir(parents=True)
    assert task.warm_start(models.build(hp, 2), "", info) == (None, "no blessed model yet")
    assert task.warm_start(models.build(hp, 2), str(serving), info) == (
        None,
        "the last blessed model has no Keras weights",
    )
    keras_dir = tmp_path / "model" / artifact_files.KERAS_DIR
    keras_dir.mkdir()
    base.save_weights(str(keras_dir / artifact_files.WEIGHTS_FILE))
    (keras_dir / artifact_files.INFO_FILE).write_text(json.dumps({**info, "class_names": ["cat", "dog", "bird"]}))
    assert task.warm_start(models.build(hp, 2), str(serving), info) == (
        None,
        "the last blessed model was trained on other classes",
    )
    (keras_dir / artifact_files.INFO_FILE).write_text(json.dumps({**info, "image_size": 2 * SIZE}))
    assert (
        task.warm_start(models.build(hp, 2), str(serving), info)[1]
        == f"the last blessed model differs (image_size {2 * SIZE} -> {SIZE})"
    )
    (keras_dir / artifact_files.INFO_FILE).write_text(json.dumps(info))
    fresh = models.build(hp, 2)
    assert task.warm_start(fresh, str(serving), info) == (str(keras_dir), "")
    assert all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), base.get_weights()))


def test_the_serving_signature_runs_the_model_in_bounded_chunks(transformed, tmp_path):
    """A batch of any size is served MODEL_CHUNK images a model call (a caller's batch of small JPEGs must not
    become gigabytes of activations): the same probabilities as one image at a time, and an empty batch works."""
    from trainer import export

    images, _, tft_output = transformed
    hp = HParams(model="cnn", image_size=SIZE)
    model = models.build(hp, num_classes=tft_output.vocabulary_size_by_name(features.LABEL_VOCABULARY))
    export.export(model, tft_output, hp, str(tmp_path / "serving"))
    serve = tf.saved_model.load(str(tmp_path / "serving")).signatures["serving_default"]
    batch = [data for data, _ in images] * 25  # 150 images: chunks of 64, 64 and 22
    assert len(batch) > 2 * export.MODEL_CHUNK
    together = serve(image_bytes=tf.constant(batch))["probabilities"].numpy()
    alone = np.concatenate([serve(image_bytes=tf.constant([data]))["probabilities"].numpy() for data, _ in images])
    np.testing.assert_allclose(together, np.tile(alone, (25, 1)), atol=1e-5)  # oneDNN rounds by batch size
    assert serve(image_bytes=tf.constant([], tf.string))["probabilities"].shape == (0, alone.shape[1])


# --- imbalanced classes (trainer/class_balance.py) ------------------------------------------------------------


def _write_counts(path, counts, size=SIZE, seed=0):
    """Records as Transform writes them, `counts[k]` of class k (a grey level of its own under noise)."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for label, n in enumerate(counts):
            for _ in range(n):
                pixels = np.clip(64 + 24 * label + rng.integers(-40, 41, size=(size, size, 3)), 0, 255).astype(np.uint8)
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                features.PIXELS_KEY: tf.train.Feature(
                                    bytes_list=tf.train.BytesList(value=[tf.io.serialize_tensor(pixels).numpy()])
                                ),
                                features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                            }
                        )
                    ).SerializeToString()
                )


def test_imbalanced_training_weights_classes_and_starts_the_bias_at_the_mix_the_loss_sees():
    from trainer import class_balance

    plan = class_balance.plan("auto", [1600, 32], ["ok", "defect"])
    assert plan["mode"] == "weights" and plan["imbalanced"] and plan["imbalance_ratio"] == 50.0
    assert plan["monitor"] == "val_balanced_accuracy"
    # Keras' recipe n / (k * count): 0.51 for ok, 25.5 for defect, capped at MAX_WEIGHT (20).
    assert plan["weights"] == pytest.approx([1632 / 3200, class_balance.MAX_WEIGHT], rel=1e-9)
    mix = np.array([1600 * plan["weights"][0], 32 * plan["weights"][1]])
    assert np.exp(plan["initial_bias"]) == pytest.approx(mix / mix.sum(), rel=1e-9)
    # Balanced data: nothing is done, training follows accuracy as before, the bias starts at the log priors.
    plan = class_balance.plan("auto", [180, 178, 175], ["a", "b", "c"])
    assert (plan["mode"], plan["weights"], plan["monitor"]) == ("off", None, "val_sparse_categorical_accuracy")
    assert np.exp(plan["initial_bias"]) == pytest.approx(np.array([180, 178, 175]) / 533, rel=1e-9)
    # Asked for: sampling gives class-balanced batch shares (equal within the cap), off leaves the mix alone.
    assert class_balance.plan("sampling", [900, 100], ["a", "b"])["shares"] == pytest.approx([0.5, 0.5])
    assert class_balance.plan("off", [1600, 32], ["ok", "defect"])["mode"] == "off"
    assert class_balance.imbalance_ratio({"a": 10, "b": 0, "c": 5}) == 2.0  # a class without images is left out


def test_loss_weights_reach_every_training_example_by_its_class(tmp_path):
    _write_counts(str(tmp_path / "train.gz"), [300, 20])
    hp = HParams(model="cnn", image_size=SIZE, batch_size=64, seed=3)
    balance = input_pipeline.Balance("weights", weights=[0.5, 8.0])
    batches = list(input_pipeline.make_dataset([str(tmp_path / "train.gz")], hp, training=True, balance=balance))
    labels = np.concatenate([y.numpy() for _, y, _ in batches])
    weights = np.concatenate([w.numpy() for _, _, w in batches])
    assert len(labels) == 320 and (labels == 1).sum() == 20  # every example once, as without weights
    assert set(weights[labels == 0]) == {0.5} and set(weights[labels == 1]) == {8.0}
    # Evaluation is never weighted: its figures are the plain ones.
    assert (
        len(next(iter(input_pipeline.make_dataset([str(tmp_path / "train.gz")], hp, training=False, balance=balance))))
        == 2
    )
    # the class counts the Trainer reads from these records (trainer/holdout.py), a fifth of each class held out
    chosen = holdout.choose([str(tmp_path / "train.gz")], 2, False, hp.seed)
    assert [t + h for t, h in zip(chosen.train_counts, chosen.held_counts)] == [300, 20]
    assert list(chosen.held_counts) == [60, 4]


def test_class_balanced_batches_draw_the_rare_class_as_often_as_the_common_one(tmp_path):
    _write_counts(str(tmp_path / "train.gz"), [950, 50])
    hp = HParams(model="cnn", image_size=SIZE, batch_size=100, seed=4)
    balance = input_pipeline.Balance("sampling", shares=[0.5, 0.5], counts=[950, 50])
    dataset = input_pipeline.make_dataset([str(tmp_path / "train.gz")], hp, training=True, balance=balance)
    assert int(dataset.cardinality()) == 10  # an epoch is still as many examples as the split has
    labels = np.concatenate([y.numpy() for _, y in dataset.take(3)])  # the first batches
    assert 0.38 < labels.mean() < 0.62  # half rare (binomial: 0.5 +- 0.029 over 300 draws)
    # The rare class's images recur within an epoch; the common class's are drawn without favour.
    assert len(labels) == 300


def test_balanced_accuracy_and_loss_during_training_match_their_definitions():
    """The Keras metrics training follows on imbalanced data, against scikit-learn on the same predictions."""
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(0)
    labels = np.concatenate([np.zeros(90, int), np.ones(8, int), np.full(2, 2)])
    probabilities = rng.dirichlet([1, 1, 1], size=100).astype(np.float32)
    accuracy = models.BalancedAccuracy(3)
    loss = models.BalancedCrossEntropy(3)
    for start in range(0, 100, 32):  # in batches, as Keras updates them
        accuracy.update_state(labels[start : start + 32], probabilities[start : start + 32])
        loss.update_state(labels[start : start + 32], probabilities[start : start + 32])
    assert float(accuracy.result()) == pytest.approx(balanced_accuracy_score(labels, probabilities.argmax(1)), rel=1e-6)
    per_class = [-np.log(probabilities[labels == c, c]).mean() for c in range(3)]
    assert float(loss.result()) == pytest.approx(np.mean(per_class), rel=1e-5)


def test_a_pace_probe_holds_only_its_own_few_batches(tmp_path):
    """--model auto times a candidate's first steps (make_dataset(probe=batches)): it takes that many batches of the
    part's first records, in their files' order, held on their own and repeated, whether the part fits the cache or
    not: no shuffle buffer and no shared cache is filled for a few steps (the fine-tuned candidate's probe filled the
    224 px cache, 1.2 GB at 10,000 images, and was then not tried)."""
    _write_transformed(str(tmp_path / "part.gz"), 40)
    files = [str(tmp_path / "part.gz")]
    for budget in (0.001, 100):  # megabytes: streamed, cached
        hp = HParams(model="cnn", image_size=SIZE, batch_size=8, seed=4, cache_megabytes=budget)
        shared = input_pipeline.read_records(files, hp)
        probe = input_pipeline.make_dataset([], hp, True, shared_records=shared, probe=2)
        assert int(probe.cardinality()) == 2
        assert seconds_per_batch_read(probe) > 0  # its first reading, from the files, timed
        seen = [np.concatenate([y.numpy() for _, y in probe]) for _ in range(2)]
        np.testing.assert_array_equal(seen[0], np.arange(16) % 3)  # the first 16 records, in order
        np.testing.assert_array_equal(seen[1], seen[0])  # the same ones again, from memory
        training = np.concatenate(
            [y.numpy() for _, y in input_pipeline.make_dataset([], hp, True, shared_records=shared)]
        )
        assert len(training) == 40 and not np.array_equal(training, np.arange(40) % 3)  # training still shuffles


@pytest.mark.parametrize("balance", ["off", "sampling"])
def test_a_head_fitted_on_features_depends_on_its_own_fit_alone(balance):
    """The operating point's heads on cached features (the folds, then the refit) are fitted one after the other on
    one compiled head (trainer/task.py _HeadFits): a fit's weights are those the same fit gives first thing on a new
    one, to the bit, whatever was fitted before it (nothing of the weights, the optimizer or the dropout's random
    state carries over)."""
    from trainer import class_balance, task

    rng = np.random.default_rng(0)
    labels = rng.choice(3, size=150, p=[0.6, 0.3, 0.1])
    vectors = rng.normal(size=(150, 24)).astype(np.float32)
    vectors[np.arange(150), labels] += 2.0  # a learnable signal: the fits move far from where they start
    hp = HParams(model="efficientnet_lite0", batch_size=16, dropout=0.3, head_units=8)  # two dropout layers
    balancing = class_balance.plan(balance, list(np.bincount(labels, minlength=3)), ["a", "b", "c"])

    def weights(head):
        return [w.copy() for w in head.get_weights()]

    after_others = task._HeadFits(hp, 3, 24, balancing)
    first = weights(after_others.fit(vectors[:100], labels[:100], 6, seed=1))
    second = weights(after_others.fit(vectors[50:], labels[50:], 4, seed=2))
    for fitted, (rows, epochs, seed) in ((second, (slice(50, None), 4, 2)), (first, (slice(None, 100), 6, 1))):
        alone = weights(task._HeadFits(hp, 3, 24, balancing).fit(vectors[rows], labels[rows], epochs, seed))
        for a, b in zip(fitted, alone, strict=True):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], second[0])  # two fits, two heads


def test_what_training_s_dropped_caches_held_goes_back_to_the_system():
    """Locally the stages after the Trainer run in its process: the memory of the tf.data caches training dropped
    (records of ~150 KB at 224 px, which glibc's heap would keep) is handed back when the Trainer ends."""
    import psutil

    from components.freed_memory import give_back_freed_memory

    process = psutil.Process()
    started = process.memory_info().rss

    def train_on_a_cache():  # 2,000 images of 224 px (300 MB) cached in memory, read twice, dropped
        images = tf.data.Dataset.range(2000).map(lambda i: tf.fill([224, 224, 3], tf.cast(i % 255, tf.uint8)))
        cached = images.cache()
        for _ in range(2):
            for _ in cached.batch(64):
                pass

    train_on_a_cache()
    if not give_back_freed_memory():
        pytest.skip("malloc_trim is glibc's: elsewhere the Trainer hands nothing back")
    assert process.memory_info().rss - started < 100e6  # of the cache's 300 MB (glibc kept all of it here without)
