"""A transfer model's head on its own, for the Evaluator to score on the features step's cached features
(components/evaluator/on_features.py) rather than running the frozen backbone on every eval image again.

Exported when the kept model's backbone is the one the features step ran (no fine-tuning), single-label:

  <model>/features_head/Format-Serving    a SavedModel whose signatures have the serving model's names
      serving_examples     examples: [batch] the features step's records ({features, label, key}) -> probabilities
      transform_features   examples -> {label}: the record's class id (TFMA's preprocessing function)
  <model>/features_head/head.json          the features it reads: the features step's fingerprint and dim
"""

import json
import os

import tensorflow as tf

from trainer import features, models
from trainer.artifact_files import HEAD_DIR, HEAD_INFO
from trainer.hparams import HParams


class HeadModule(tf.Module):
    def __init__(self, head, dim: int):
        super().__init__(name="features_head")
        self.head = head
        self._spec = {
            features.FEATURES_KEY: tf.io.FixedLenFeature([dim], tf.float32),
            features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def serve_examples(self, examples):
        vectors = tf.io.parse_example(examples, {features.FEATURES_KEY: self._spec[features.FEATURES_KEY]})
        return {"probabilities": tf.cast(self.head(vectors[features.FEATURES_KEY], training=False), tf.float32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
    def transform_features(self, examples):
        label = {features.LABEL_KEY: self._spec[features.LABEL_KEY]}
        return {features.LABEL_KEY: tf.io.parse_example(examples, label)[features.LABEL_KEY]}


def export_head(model, hp: HParams, num_classes: int, source: dict, model_uri: str) -> str:
    """Writes the head of `model` (the whole model, its head trained and its operating point folded in) under
    model_uri; returns its folder."""
    head = models.head(num_classes, source["dim"], hp)
    models.copy_head(model, head)
    module = HeadModule(head, source["dim"])
    folder = os.path.join(model_uri, HEAD_DIR)
    tf.saved_model.save(
        module,
        os.path.join(folder, "Format-Serving"),
        signatures={"serving_examples": module.serve_examples, "transform_features": module.transform_features},
    )
    with tf.io.gfile.GFile(os.path.join(folder, HEAD_INFO), "w") as f:
        f.write(json.dumps({"fingerprint": source["fingerprint"], "dim": source["dim"]}))
    return folder
