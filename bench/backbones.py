"""Backbone weights made here, for tests and benchmarks that must not download ImageNet's.

A randomly initialised MobileNetV2 or EfficientNetB0 with its BatchNormalization statistics left at
their initial values (mean 0, variance 1) squashes every image to nearly the same pooled vector
(measured: values of ~1e-13), which no head can learn from. calibrated_weights() sets each
BatchNormalization layer's statistics from a batch of the caller's images (one forward pass in
training mode with momentum 0), so the random backbone's features vary with the image, as a
pretrained one's do, and saves the weights: a file for `--weights`.
"""

import numpy as np


def calibrated_weights(model: str, image_size: int, images: np.ndarray, path: str, seed: int = 0) -> str:
    """Writes `model`'s random weights, BatchNorm calibrated on `images` ([n, size, size, 3] in 0..255), to path."""
    import keras

    from trainer import models
    from trainer.hparams import HParams

    keras.utils.set_random_seed(seed)
    hp = HParams(model=model, image_size=image_size, weights="")
    backbone = models.make_backbone(hp)
    norms = [layer for layer in backbone.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    backbone.trainable = True  # a frozen BatchNormalization layer ignores training=True
    images = np.asarray(images, "float32")
    backbone(images / 127.5 - 1.0 if model == "mobilenet_v2" else images, training=True)  # as models._scaled does
    for layer in norms:
        layer.momentum = 0.99
    backbone.save_weights(path)
    return path
