"""The exported SavedModel: a tf.Module whose signatures run Transform's graph, then the model.

  serving_default     image_bytes: [batch] encoded JPEG/PNG/GIF/BMP bytes
                      -> probabilities [batch, classes], class_names [batch, classes],
                         predicted_class [batch], predicted_probability [batch]
                      (a multi-label model: each label's own probability, and its most likely label; which labels
                      apply is decided at each label's threshold, chosen by the Evaluator: threshold.json)
  serving_examples    examples: [batch] serialized raw tf.Examples -> the same outputs (the Evaluator's)
  transform_features  examples -> Transform's outputs, label included (TFMA's preprocessing function; a multi-label
                      model's labels as a multi-hot [batch, classes])

and two functions of the module (not signatures) for explanations (trainer/explain.py), which differentiate the
serving graph's model with respect to its input pixels:

  image_pixels(image_bytes)         -> uint8 [batch, size, size, channels], Transform's decode and resize
  pixel_probabilities(pixels)       float32 pixels in 0..255 -> probabilities [batch, classes]

Why a tf.Module: TFT's transform_features_layer() is a tf_keras layer, which a
Keras 3 functional model cannot hold; a tf.function can call both.

The model runs on at most MODEL_CHUNK images at a time, whatever batch a caller sends: its
activations, not the encoded bytes, are what a batch costs in memory (MobileNetV2 at 160 px: about
8 MB an image), and callers batch by count or by encoded bytes (TFMA sent ~700 small JPEGs at once,
5 GB of activations). Transform's decoding is bounded the same way (images/decoding.py, in preprocessing_fn).
"""

import types

import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_transform.saved import saved_transform_io_v2  # what TFT's transform_features_layer() loads with

from trainer import features
from trainer.hparams import HParams

MODEL_CHUNK = 64  # images per model call inside the signatures


class ServingModule(tf.Module):
    def __init__(self, model, tft_output: tft.TFTransformOutput, hp: HParams):
        super().__init__(name="image_classifier")
        # The Keras model is held untracked and its variables tracked: a tracked Keras model (and its backbone,
        # a model too) would each be saved with a serving function of its own, traced for nothing.
        self._keras = types.SimpleNamespace(model=model)
        self.model_variables = list(model.variables)
        # Transform's graph, loaded as TFT's transform_features_layer() loads it, without that layer: it is a
        # tf_keras Model, and saving one traces its call again for tf_keras' own signatures (7 of an export's
        # 15 s with MobileNetV2). Its loaded objects are tracked, so its tables and vocabulary are saved.
        self._transform = saved_transform_io_v2.SavedModelLoader(tft_output.transform_savedmodel_dir)
        self.transform_objects = self._transform.__dict__
        self._raw_spec = tft_output.raw_feature_spec()
        self._multi_label = features.is_multi_label(tft_output.transformed_feature_spec())
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

    def _probabilities(self, images: tf.Tensor) -> tf.Tensor:
        """The model on [batch, size, size, channels], MODEL_CHUNK images a call, one call at a time."""
        count = tf.shape(images)[0]
        chunks = (count + MODEL_CHUNK - 1) // MODEL_CHUNK
        classes = int(self.class_names.shape[0])

        def call(i, done):
            part = images[i * MODEL_CHUNK : (i + 1) * MODEL_CHUNK]
            return i + 1, done.write(i, tf.cast(self._keras.model(part, training=False), tf.float32))

        done = tf.TensorArray(tf.float32, size=chunks, infer_shape=False, element_shape=[None, classes])
        _, done = tf.while_loop(lambda i, _: i < chunks, call, [0, done], parallel_iterations=1)
        return tf.cond(chunks > 0, done.concat, lambda: tf.zeros([0, classes], tf.float32))

    def _classify(self, transformed) -> dict:
        images = features.decode_pixels(transformed[features.PIXELS_KEY], self._image_size, self._channels)
        probabilities = self._probabilities(images)
        best = tf.argmax(probabilities, axis=1)
        batch = tf.shape(probabilities)[0]
        return {
            "probabilities": probabilities,
            "class_names": tf.tile(self.class_names[tf.newaxis, :], [batch, 1]),
            "predicted_class": tf.gather(self.class_names, best),
            "predicted_probability": tf.reduce_max(probabilities, axis=1),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")], autograph=False)
    def image_pixels(self, image_bytes):
        transformed = self._transform.apply_transform_model({features.IMAGE_KEY: self._raw_image_feature(image_bytes)})
        return features.decode_pixel_bytes(transformed[features.PIXELS_KEY], self._image_size, self._channels)

    @tf.function(autograph=False)
    def pixel_probabilities(self, pixels):
        return tf.cast(self._keras.model(pixels, training=False), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")], autograph=False)
    def serve_image_bytes(self, image_bytes):
        # Only the image is known at serving time: Transform's outputs that need the label are pruned.
        transformed = self._transform.apply_transform_model({features.IMAGE_KEY: self._raw_image_feature(image_bytes)})
        return self._classify(transformed)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def serve_examples(self, examples):
        # The images' bytes into serve_image_bytes: its graph, traced once for both signatures (saving a
        # model traces each signature; Transform's layer and the model are most of an export's time).
        spec = {features.IMAGE_KEY: self._raw_spec[features.IMAGE_KEY]}
        return self.serve_image_bytes(features.to_dense(tf.io.parse_example(examples, spec)[features.IMAGE_KEY]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def transform_features(self, examples):
        names = features.LABELS_TEXT_KEY if self._multi_label else features.LABEL_TEXT_KEY
        spec = {k: self._raw_spec[k] for k in (features.IMAGE_KEY, names)}
        transformed = self._transform.apply_transform_model(tf.io.parse_example(examples, spec))
        if self._multi_label:
            transformed = {
                **transformed,
                features.LABELS_KEY: features.label_target(
                    transformed, int(self.class_names.shape[0]), multi_label=True
                ),
            }
        return transformed


def export(model, tft_output: tft.TFTransformOutput, hp: HParams, export_dir: str) -> None:
    module = ServingModule(model, tft_output, hp)
    # Traced for the model's input shape (explanations differentiate it; saved with the module, not as a signature).
    module.pixel_probabilities.get_concrete_function(
        tf.TensorSpec([None, hp.image_size, hp.image_size, hp.channels], tf.float32, name="pixels")
    )
    tf.saved_model.save(
        module,
        export_dir,
        signatures={
            "serving_default": module.serve_image_bytes,
            "serving_examples": module.serve_examples,
            "transform_features": module.transform_features,
        },
    )
