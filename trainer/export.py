"""The exported SavedModel: a tf.Module whose signatures run Transform's graph, then the model.

  serving_default     image_bytes: [batch] encoded JPEG/PNG/GIF/BMP bytes
                      -> probabilities [batch, classes], class_names [batch, classes],
                         predicted_class [batch], predicted_probability [batch]
  serving_examples    examples: [batch] serialized raw tf.Examples -> the same outputs (the Evaluator's)
  transform_features  examples -> Transform's outputs, label included (TFMA's preprocessing function)

Why a tf.Module: TFT's transform_features_layer() is a tf_keras layer, which a
Keras 3 functional model cannot hold; a tf.function can call both.
"""

import tensorflow as tf
import tensorflow_transform as tft

from trainer import features
from trainer.hparams import HParams


class ServingModule(tf.Module):
    def __init__(self, model, tft_output: tft.TFTransformOutput, hp: HParams):
        super().__init__(name="image_classifier")
        self.model = model
        self.tft_layer = tft_output.transform_features_layer()
        self._raw_spec = tft_output.raw_feature_spec()
        self._image_size, self._channels = hp.image_size, hp.channels
        names = tft_output.vocabulary_by_name(features.LABEL_VOCABULARY)
        self.class_names = tf.Variable(names, trainable=False, name="class_names")

    def _raw_image_feature(self, image_bytes: tf.Tensor):
        """Encoded images shaped as Transform's raw feature spec expects them."""
        spec = self._raw_spec[features.IMAGE_KEY]
        column = tf.reshape(image_bytes, [-1, 1])
        if isinstance(spec, tf.io.FixedLenFeature):
            return column
        return tf.sparse.from_dense(column)

    def _classify(self, transformed) -> dict:
        images = features.decode_pixels(transformed[features.PIXELS_KEY], self._image_size, self._channels)
        probabilities = tf.cast(self.model(images, training=False), tf.float32)
        best = tf.argmax(probabilities, axis=1)
        batch = tf.shape(probabilities)[0]
        return {
            "probabilities": probabilities,
            "class_names": tf.tile(self.class_names[tf.newaxis, :], [batch, 1]),
            "predicted_class": tf.gather(self.class_names, best),
            "predicted_probability": tf.reduce_max(probabilities, axis=1),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve_image_bytes(self, image_bytes):
        # Only the image is known at serving time: Transform's outputs that need the label are pruned.
        transformed = self.tft_layer({features.IMAGE_KEY: self._raw_image_feature(image_bytes)})
        return self._classify(transformed)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_examples(self, examples):
        spec = {features.IMAGE_KEY: self._raw_spec[features.IMAGE_KEY]}
        transformed = self.tft_layer(tf.io.parse_example(examples, spec))
        return self._classify(transformed)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def transform_features(self, examples):
        spec = {k: self._raw_spec[k] for k in (features.IMAGE_KEY, features.LABEL_TEXT_KEY)}
        return self.tft_layer(tf.io.parse_example(examples, spec))


def export(model, tft_output: tft.TFTransformOutput, hp: HParams, export_dir: str) -> None:
    module = ServingModule(model, tft_output, hp)
    tf.saved_model.save(module, export_dir, signatures={
        "serving_default": module.serve_image_bytes,
        "serving_examples": module.serve_examples,
        "transform_features": module.transform_features,
    })
