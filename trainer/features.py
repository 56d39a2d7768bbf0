"""Feature names and the one pixel decoding shared by training, evaluation and serving."""

import tensorflow as tf

from images import feature_keys

# Raw features, as ImageExampleGen writes them.
IMAGE_KEY = feature_keys.ENCODED
LABEL_TEXT_KEY = feature_keys.LABEL_TEXT
LABELS_TEXT_KEY = feature_keys.LABELS_TEXT  # multi-label examples: every label's name, none included
# Passed through Transform for data health (components/health): the file, its size as found.
PASSTHROUGH = {
    "key": feature_keys.SHA256,
    "filename": feature_keys.FILENAME,
    "original_height": feature_keys.ORIGINAL_HEIGHT,
    "original_width": feature_keys.ORIGINAL_WIDTH,
}

# Transformed features, as Transform materialises them.
PIXELS_KEY = "pixels"  # the resized image's uint8 pixels, 1 byte each (components/transform/preprocessing.py)
LABEL_KEY = "label"  # class id from the TFT vocabulary
LABELS_KEY = "labels"  # multi-label: the ids of the image's labels (VarLen, none included), instead of LABEL_KEY
LABEL_VOCABULARY = "label"  # the vocabulary file: class names (multi-label: label names) in id order
KEY = "key"  # the image's content hash (image/key/sha256), passed through: features and data health join on it
FILENAME_KEY = "filename"

# Backbone features, as the features step (components/features) writes them beside LABEL_KEY and KEY.
FEATURES_KEY = "features"  # float32 [views * dim]: the pooled backbone output of the image, then of its augmented views


def is_multi_label(feature_spec) -> bool:
    """Whether examples with this feature spec (Transform's, or the features step's) are multi-label."""
    return LABELS_KEY in feature_spec


def label_spec(multi_label: bool):
    """How the label of Transform's (or the features step's) records parses: a class id, or the label ids."""
    return (
        {LABELS_KEY: tf.io.VarLenFeature(tf.int64)} if multi_label else {LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)}
    )


def label_target(parsed, num_classes: int, multi_label: bool) -> tf.Tensor:
    """What the model is trained on: the class id [batch] int64, or the multi-hot labels [batch, classes] float32
    (an id out of range, as TFT's -1 for a name it does not know, sets nothing). The label ids are sparse, or dense
    [batch, k] where the raw schema gave every image k labels (SchemaGen infers a fixed length when every image of
    a set has as many: 500 labels on 60 images, six each, ended the Trainer's export in an AttributeError)."""
    if not multi_label:
        return parsed[LABEL_KEY]
    ids = parsed[LABELS_KEY]
    if not isinstance(ids, tf.SparseTensor):
        ids = tf.cast(tf.reshape(ids, [tf.shape(ids)[0], -1]), tf.int64)
        known = (ids >= 0) & (ids < num_classes)
        hot = tf.one_hot(tf.where(known, ids, -1), num_classes, dtype=tf.float32)  # -1: a row of zeros
        return tf.maximum(tf.reduce_max(hot, axis=1), 0.0)  # no labels at all (k = 0): zeros
    known = tf.sparse.retain(ids, (ids.values >= 0) & (ids.values < num_classes))
    return tf.cast(tf.sparse.to_indicator(known, num_classes), tf.float32)


def list_files(patterns) -> list:
    """The record files these patterns match, sorted; FileNotFoundError when none."""
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise FileNotFoundError(f"no transformed records match {patterns}")
    return files


def compression(files) -> str:
    """The TFRecord compression of these files: Transform writes gzip (.gz); the features step writes its small,
    barely compressible vectors uncompressed (gzip cost it more than reading them saves)."""
    return "GZIP" if all(str(f).endswith(".gz") for f in files) else ""


# tf.data's autotuning off (record_batches, the Trainer's datasets: trainer/input_pipeline.py): an autotuned iterator's
# end waited for its tuning thread, the CPU idle, where a model ran between reads (docs/benchmarks.md, The Evaluator)
NOT_AUTOTUNED = tf.data.Options()
NOT_AUTOTUNED.autotune.enabled = False


def record_batches(files, batch: int, most: int = -1) -> tf.data.Dataset:
    """These record files' records in order (the first `most`; -1: all), `batch` at a time, for a loop that runs a
    model between reads: tf.data's autotuning off. With it, the iterator's end waited ~18-20 s with the CPU idle in 3
    of 10 passes over 2,000 eval images with EfficientNet-Lite0 called between reads (2 cores), and in none of 10
    without it; these batches need no tuning (one reader, no map)."""
    return tf.data.TFRecordDataset(files, compression(files)).take(most).batch(batch).with_options(NOT_AUTOTUNED)


def to_dense(feature) -> tf.Tensor:
    """A raw one-value feature as a [batch] tensor, whether the schema gave it a fixed shape or not."""
    if isinstance(feature, tf.SparseTensor):
        feature = tf.sparse.to_dense(feature)  # "" or 0 where missing
    return tf.reshape(feature, [-1]) if feature.shape.rank == 1 else feature[:, 0]


def decode_pixel_bytes(serialized: tf.Tensor, image_size: int, channels: int) -> tf.Tensor:
    """[batch] strings from `pixels` -> [batch, size, size, channels] uint8, as Transform wrote them.

    Each string is a serialized uint8 tensor; its pixel bytes are the last
    size*size*channels bytes, so one vectorised decode_raw reads the whole batch.
    """
    count = image_size * image_size * channels
    raw = tf.io.decode_raw(serialized, tf.uint8)
    return tf.reshape(raw[:, -count:], [-1, image_size, image_size, channels])


def decode_pixels(serialized: tf.Tensor, image_size: int, channels: int) -> tf.Tensor:
    """[batch] strings from `pixels` -> [batch, size, size, channels] float32 in 0..255 (decode_pixel_bytes)."""
    return tf.cast(decode_pixel_bytes(serialized, image_size, channels), tf.float32)
