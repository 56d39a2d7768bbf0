"""The one pixel decoding of every path: Transform's preprocessing_fn (so training and evaluation), the
serving signature (through Transform's graph) and `imagepipe predict` of a TFLite model.

Decoding memory is bounded by the caller (bounds.DECODES_IN_FLIGHT images at once).
"""

import tensorflow as tf

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
        return tf.switch_case(
            index,
            [(lambda ratio=ratio: tf.io.decode_jpeg(encoded, channels=channels, ratio=ratio)) for ratio in JPEG_RATIOS],
        )

    def decode_any():
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)

    image = tf.cond(tf.io.is_jpeg(encoded), decode_jpeg, decode_any)
    image.set_shape([None, None, channels])
    resized = tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
