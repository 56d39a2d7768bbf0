"""Transform's preprocessing_fn: decode, resize, and the label vocabulary (a class id, or a multi-label image's ids).

    Transform(preprocessing_fn="trainer.preprocessing.preprocessing_fn", custom_config=...)

What is materialised: the resized image as uint8 pixels, one byte each (a
serialized uint8 tensor), ~2.4x the JPEG bytes at 160x160. Float32 pixels
would be 4 bytes each (~10x JPEG; the known TFX complaint of 30 GB of JPEG
turning into 280 GB of records), and decoding JPEG in every training epoch is
the slow path this avoids. Scaling to the model's input range is the model's
first layer, so training, evaluation and serving all scale in the same graph.
Augmentation (flips, crops) is random per epoch and belongs to the training
input function (trainer/input_pipeline.py), not here.
"""

from typing import Any, Dict, Optional

import tensorflow as tf
import tensorflow_transform as tft

from trainer import features
from trainer.hparams import DECODES_IN_FLIGHT, HParams

JPEG_RATIOS = (1, 2, 4, 8)  # the scales libjpeg decodes to directly (tf.io.decode_jpeg's ratio)


def jpeg_scale_index(height: tf.Tensor, width: tf.Tensor, image_size: int) -> tf.Tensor:
    """Index into JPEG_RATIOS of the largest DCT scale-down that keeps both sides >= image_size."""
    smaller = tf.minimum(height, width)
    return tf.add_n([tf.cast(smaller >= ratio * image_size, tf.int32) for ratio in JPEG_RATIOS[1:]])


def decode_and_resize(encoded: tf.Tensor, image_size: int, channels: int) -> tf.Tensor:
    """One encoded image (JPEG, PNG, GIF, BMP) -> [size, size, channels] uint8.

    A JPEG is decoded at the smallest of libjpeg's DCT scales (1/8, 1/4, 1/2) that still
    leaves both sides at least image_size: a 12 MP photo for a 224 px model becomes
    504x378 pixels straight from the DCT coefficients, 1/64 of the decoding work and
    memory, and close to what an area filter would give. Other formats decode at
    full size. Training, evaluation and serving all run this one function.
    """
    def decode_jpeg():
        shape = tf.image.extract_jpeg_shape(encoded)  # header only
        index = jpeg_scale_index(shape[0], shape[1], image_size)
        return tf.switch_case(index, [
            (lambda ratio=ratio: tf.io.decode_jpeg(encoded, channels=channels, ratio=ratio))
            for ratio in JPEG_RATIOS])

    def decode_any():
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)

    image = tf.cond(tf.io.is_jpeg(encoded), decode_jpeg, decode_any)
    image.set_shape([None, None, channels])
    resized = tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


def preprocessing_fn(inputs: Dict[str, Any], custom_config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    hp = HParams.from_custom_config(custom_config)
    encoded = features.to_dense(inputs[features.IMAGE_KEY])
    pixels = tf.map_fn(
        lambda e: tf.io.serialize_tensor(decode_and_resize(e, hp.image_size, hp.channels)),
        encoded, fn_output_signature=tf.TensorSpec([], tf.string),
        parallel_iterations=DECODES_IN_FLIGHT)  # bounds decoding memory (hparams.decode_memory_bytes)
    # The file's hash, name and size, unchanged, for the features step and data health (a curated schema
    # may leave any of them out).
    outputs = {name: features.to_dense(inputs[raw]) for name, raw in features.PASSTHROUGH.items() if raw in inputs}
    # Multi-label examples (ImageExampleGen --task multi) carry every label's name, none included: their ids are a
    # VarLen feature of their own (features.LABELS_KEY), which the Trainer turns into a multi-hot vector.
    multi_label = features.LABELS_TEXT_KEY in inputs
    names = inputs[features.LABELS_TEXT_KEY] if multi_label else features.to_dense(inputs[features.LABEL_TEXT_KEY])
    return {
        **outputs,
        features.PIXELS_KEY: pixels,
        # Ids come from the training data; the vocabulary file maps them back to class names.
        # Ordered by a fingerprint of each name, not by frequency: the same classes get the same
        # ids in every run, whatever their counts, so a retrained model can warm-start.
        features.LABELS_KEY if multi_label else features.LABEL_KEY: tft.compute_and_apply_vocabulary(
            names, vocab_filename=features.LABEL_VOCABULARY, num_oov_buckets=0, default_value=-1,
            fingerprint_shuffle=True),
    }
