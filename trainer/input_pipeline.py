"""The training input: tf.data over Transform's materialised records.

    shard files -> [shuffle files] -> interleave -> [cache] -> shuffle(seed) -> batch -> parse (vectorised)
      -> [augment] -> prefetch

Parsing happens after batching: one parse_example and one decode_raw per batch
instead of one per image. The serialized records are cached in memory when they
fit (decoding them again is a memcpy). Training shuffles every epoch: over the
whole set when it is cached (the shuffle buffer then holds references to the
cached records, not copies: measured, no extra memory), else over shuffled shards
and a buffer of as many records as SHUFFLE_SHARE of the cache budget holds.
ImageExampleGen already writes the examples in a shuffled order, so no class
arrives in a block even then. The records are counted once, so the dataset has a
known length: Keras 3 then knows each epoch's steps.
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


# Without a cache, the shuffle buffer holds at most this share of the cache budget (hp.cache_limit_megabytes).
SHUFFLE_SHARE = 0.25


def measure(files: List[str]) -> Tuple[int, float]:
    """(records, megabytes of records as they are held in memory): one pass over the framing, no parsing."""
    records = tf.data.TFRecordDataset(files, compression_type="GZIP", num_parallel_reads=AUTOTUNE)
    count, size = records.reduce((tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
                                 lambda acc, r: (acc[0] + 1, acc[1] + tf.cast(tf.strings.length(r), tf.int64)))
    return int(count), int(size) / 2**20


def shuffle_buffer(records: int, megabytes: float, cached: bool, hp: HParams) -> int:
    """Every record when they are cached; else as many as SHUFFLE_SHARE of the cache budget holds."""
    if cached or not records:
        return max(1, records)
    fits = int(hp.cache_limit_megabytes() * SHUFFLE_SHARE / (megabytes / records))
    return max(1, min(records, max(fits, hp.batch_size)))


def make_dataset(file_patterns: List[str], hp: HParams, training: bool,
                 batch_size: int = 0, drop_remainder: bool = False) -> tf.data.Dataset:
    """(images float32 [batch, size, size, channels] in 0..255, labels int64 [batch]).

    drop_remainder gives every batch the same shape, which TPUs (XLA) need.
    """
    files = list_files(file_patterns)
    batch_size = batch_size or hp.batch_size
    records, megabytes = measure(files)
    cached = megabytes <= hp.cache_limit_megabytes()
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=hp.seed, reshuffle_each_iteration=True)
    dataset = dataset.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=min(len(files), 8), num_parallel_calls=AUTOTUNE, deterministic=True)  # seeds reproduce
    # TFX Transform writes gzip records: reading them is inflate-bound, and the cache is a memcpy
    # (README: Benchmarks, Training input). So cache whenever they fit.
    if cached:
        dataset = dataset.cache()
    if training:
        dataset = dataset.shuffle(shuffle_buffer(records, megabytes, cached, hp), seed=hp.seed,
                                  reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    batches = records // batch_size if drop_remainder else -(-records // batch_size)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    dataset = dataset.map(lambda records: parse_batch(records, hp), num_parallel_calls=AUTOTUNE)
    if training and hp.augmentations:
        dataset = dataset.map(lambda x, y: (augment(x, hp), y), num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


def repeated(dataset: tf.data.Dataset) -> Tuple[tf.data.Dataset, int]:
    """(the training dataset repeated, its batches per epoch), for fit(steps_per_epoch=...): one iterator
    for the whole training. Keras otherwise makes a new one each epoch, and tearing one down stalls the
    next epoch by up to ~0.6 s here (measured on the digits: epochs of 0.63 s, every third 1.2 s)."""
    return dataset.repeat(), int(dataset.cardinality())


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
