"""The training input: tf.data over Transform's materialised records.

    shard files -> interleave -> [cache] -> shuffle(seed) -> batch -> parse (vectorised) -> [augment] -> prefetch

Parsing happens after batching: one parse_example and one decode_raw per batch
instead of one per image. The serialized records are cached in memory when they
fit (decoding them again is a memcpy), and shuffled every epoch after the cache.
The records are counted once, so the dataset has a known length: Keras 3 then
knows each epoch's steps (with an unknown length it warns at every epoch's end).
"""

from typing import List, Tuple

import tensorflow as tf

from trainer import features
from trainer.hparams import HParams

AUTOTUNE = tf.data.AUTOTUNE


def list_files(patterns: List[str]) -> List[str]:
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise FileNotFoundError(f"no transformed records match {patterns}")
    return files


def count_records(files: List[str]) -> int:
    """One pass over the record framing (no parsing)."""
    records = tf.data.TFRecordDataset(files, compression_type="GZIP", num_parallel_reads=AUTOTUNE)
    return int(records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def total_megabytes(files: List[str]) -> float:
    return sum(tf.io.gfile.stat(f).length for f in files) / 2**20


def make_dataset(file_patterns: List[str], hp: HParams, training: bool,
                 batch_size: int = 0, drop_remainder: bool = False) -> tf.data.Dataset:
    """(images float32 [batch, size, size, channels] in 0..255, labels int64 [batch]).

    drop_remainder gives every batch the same shape, which TPUs (XLA) need.
    """
    files = list_files(file_patterns)
    batch_size = batch_size or hp.batch_size
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=hp.seed, reshuffle_each_iteration=True)
    dataset = dataset.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=min(len(files), 8), num_parallel_calls=AUTOTUNE, deterministic=True)  # seeds reproduce
    # TFX Transform writes gzip records: reading them is inflate-bound, and the cache is a memcpy
    # (README: Benchmarks, Training input). So cache whenever they fit.
    if total_megabytes(files) <= hp.cache_limit_megabytes():
        dataset = dataset.cache()
    if training:
        dataset = dataset.shuffle(hp.shuffle_buffer, seed=hp.seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    records = count_records(files)
    batches = records // batch_size if drop_remainder else -(-records // batch_size)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    dataset = dataset.map(lambda records: parse_batch(records, hp), num_parallel_calls=AUTOTUNE)
    if training and hp.augmentations:
        dataset = dataset.map(lambda x, y: (augment(x, hp), y), num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


def parse_batch(records: tf.Tensor, hp: HParams) -> Tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(records, {
        features.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string),
        features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    })
    images = features.decode_pixels(parsed[features.PIXELS_KEY], hp.image_size, hp.channels)
    return images, parsed[features.LABEL_KEY]


def augment(images: tf.Tensor, hp: HParams) -> tf.Tensor:
    """Random per-image flips, crops and brightness on a batch (training only)."""
    augmentations = hp.augmentations
    if "flip" in augmentations:
        images = tf.image.random_flip_left_right(images, seed=hp.seed)
    if "crop" in augmentations:
        # Pad by 1/8 of the side on each edge, then crop back at a random offset.
        pad = max(1, hp.image_size // 8)
        padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
        images = tf.map_fn(
            lambda im: tf.image.random_crop(im, [hp.image_size, hp.image_size, hp.channels], seed=hp.seed),
            padded)
    if "brightness" in augmentations:
        delta = tf.random.uniform([tf.shape(images)[0], 1, 1, 1], -25.0, 25.0, seed=hp.seed)
        images = tf.clip_by_value(images + delta, 0.0, 255.0)
    return images
