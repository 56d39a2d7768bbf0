"""Transform's preprocessing_fn: decode, resize, and the label vocabulary (a class id, or a multi-label image's ids).

    Transform(preprocessing_fn="components.transform.preprocessing.preprocessing_fn", custom_config=...)

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

from images.bounds import DECODES_IN_FLIGHT
from images.decoding import decode_and_resize
from trainer import features
from trainer.hparams import HParams


def preprocessing_fn(inputs: Dict[str, Any], custom_config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    hp = HParams.from_custom_config(custom_config)
    encoded = features.to_dense(inputs[features.IMAGE_KEY])
    pixels = tf.map_fn(
        lambda e: tf.io.serialize_tensor(decode_and_resize(e, hp.image_size, hp.channels)),
        encoded,
        fn_output_signature=tf.TensorSpec([], tf.string),
        parallel_iterations=DECODES_IN_FLIGHT,
    )  # bounds decoding memory (images/bounds.py)
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
            names,
            vocab_filename=features.LABEL_VOCABULARY,
            num_oov_buckets=0,
            default_value=-1,
            fingerprint_shuffle=True,
        ),
    }
