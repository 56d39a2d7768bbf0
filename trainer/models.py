"""The models, in Keras 3 (imported as `keras`: tensorflow_transform makes `tf.keras` mean tf_keras).

Every model takes float32 pixels in 0..255 and scales them itself, so training,
evaluation and serving share one scaling. Outputs are class probabilities (softmax), or for a multi-label
model each label's probability (sigmoid: any number of labels may apply, none included).

  cnn                 a small CNN: small images' model (the digits sample trains in seconds)
  efficientnet_lite0  photos' model: EfficientNet-Lite0 pretrained on ImageNet, its weights installed with a package
                      (trainer/efficientnet_lite.py)
  mobilenet_v2        keras.applications backbones (their ImageNet weights downloaded by Keras)
  efficientnet_b0
The backbones are trained in two phases: a head on the frozen backbone's cached features, then (with
--fine-tune-epochs) the top layers unfrozen, on pixels.
"""

import contextlib
import os
import shutil
import tempfile
from typing import Iterator, Optional

import keras
import tensorflow as tf
from keras import ops

from storage.files import is_remote
from trainer import efficientnet_lite
from trainer.hparams import MODELS, HParams


def staged_path(path: str) -> str:
    """A path in a new temporary folder for a copy of the file `path`: Keras reads and writes .h5 weights
    through h5py, which needs local files (gs:// ones pass through here) and fails badly on a full disk.
    discard_staged() removes it."""
    return os.path.join(tempfile.mkdtemp(prefix="imagepipe-"), os.path.basename(path))


def discard_staged(local: str) -> None:

    shutil.rmtree(os.path.dirname(local), ignore_errors=True)


@contextlib.contextmanager
def local_file(path: str) -> Iterator[str]:
    """A local path holding the .h5 file at `path`: itself, or a staged copy of a remote one, removed
    when the block ends (a process that loads weights many times, e.g. a tuner, must not fill /tmp)."""
    if not is_remote(path):
        yield path
        return
    local = staged_path(path)
    try:
        tf.io.gfile.copy(path, local, overwrite=True)
        yield local
    finally:
        discard_staged(local)


def save_weights(model: keras.Model, path: str) -> str:
    """model.save_weights(path), for a local or a remote .h5 path; returns a local path holding the
    weights (the staged file they were copied from), for whoever loads them next here. Keras writes
    through h5py into a temporary folder first, and the file is then copied: h5py failing on a full disk
    leaves objects that print tracebacks and crash the process at exit, a copy fails with one OSError."""
    local = staged_path(path)
    model.save_weights(local)
    tf.io.gfile.copy(local, path, overwrite=True)
    return local


def build(
    hp: HParams, num_classes: int, backbone: Optional[keras.Model] = None, multi_label: bool = False
) -> keras.Model:
    """The whole model, pixels to probabilities. For the transfer models: scaling, the backbone (made here,
    or `backbone`, e.g. with the weights the features step used), global average pooling, then the head."""
    if hp.model not in MODELS:
        raise ValueError(
            f"model {hp.model!r}: --model auto is chosen from the images before training (pipeline/model_choice.py)"
        )
    inputs = keras.Input((hp.image_size, hp.image_size, hp.channels), name="pixels")
    if hp.model == "cnn":
        outputs = _cnn(inputs, num_classes, hp, multi_label)
    else:
        backbone = backbone or make_backbone(hp)
        x = backbone(_scaled(hp, inputs), training=False)  # BatchNorm stays in inference mode, even when fine-tuning
        x = keras.layers.GlobalAveragePooling2D(name="pooled")(x)
        outputs = _head_layers(x, num_classes, hp, multi_label)
    return keras.Model(inputs, outputs, name=hp.model)


def feature_extractor(hp: HParams, backbone: keras.Model) -> keras.Model:
    """Pixels to the pooled backbone output: the vector the head's first layer takes, which the features step
    (components/features) computes once per image. The same scaling and layers as build()."""
    inputs = keras.Input((hp.image_size, hp.image_size, hp.channels), name="pixels")
    pooled = keras.layers.GlobalAveragePooling2D(name="pooled")(backbone(_scaled(hp, inputs), training=False))
    return keras.Model(inputs, pooled, name=f"{hp.model}_features")


def head(num_classes: int, dim: int, hp: HParams, multi_label: bool = False) -> keras.Model:
    """The transfer models' head on its own, for training on cached features (the same layers as build())."""
    inputs = keras.Input((dim,), name="features")
    return keras.Model(inputs, _head_layers(inputs, num_classes, hp, multi_label), name="head")


HEAD_LAYERS = ("head_hidden", "probabilities")  # the head's weighted layers, by name


def copy_head(source: keras.Model, target: keras.Model) -> None:
    """The head's weights from one model to the other: a head trained on features into the whole model, or
    a warm-started whole model's into the features head."""
    names = {layer.name for layer in target.layers}
    for name in HEAD_LAYERS:
        if name in names:
            target.get_layer(name).set_weights(source.get_layer(name).get_weights())


def _head_layers(x, num_classes, hp: HParams, multi_label: bool = False):
    if hp.head_units:
        x = keras.layers.Dense(hp.head_units, activation="relu", name="head_hidden")(
            keras.layers.Dropout(hp.head_dropout)(x)
        )
    return _classifier(keras.layers.Dropout(hp.head_dropout)(x), num_classes, multi_label)


def _classifier(x, num_classes, multi_label: bool = False):
    # float32 output even under a mixed-precision policy: softmax in float16 loses precision.
    return keras.layers.Dense(
        num_classes, activation="sigmoid" if multi_label else "softmax", dtype="float32", name="probabilities"
    )(x)


def is_multi_label(model: keras.Model) -> bool:
    """Whether the model gives each label its own probability (sigmoid) rather than one class's (softmax)."""
    return model.get_layer("probabilities").activation is keras.activations.sigmoid


def _cnn(inputs, num_classes, hp: HParams, multi_label: bool = False):
    # Three conv/pool blocks and a flattened head (docs/training.md: Training, evaluation and serving has
    # what it reaches): a global-average-pooled head is position-blind, and did worse on digits.
    x = inputs
    if hp.cnn_downsample > 1:  # area-averaged to a cnn's size (every converter has average pooling; not resizing)
        x = keras.layers.AveragePooling2D(hp.cnn_downsample, name="downsampled")(x)
    x = keras.layers.Rescaling(1 / 255.0)(x)
    for filters in (16, 32, 64):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    if hp.head_units:
        x = keras.layers.Dense(hp.head_units, activation="relu", name="head_hidden")(
            keras.layers.Dropout(hp.head_dropout)(x)
        )
    x = keras.layers.Dropout(hp.head_dropout)(x)
    return _classifier(x, num_classes, multi_label)


def trains_downsampled(hp: HParams) -> bool:
    """Whether this model trains on its images averaged down once (input_pipeline.Batching.downsampled) rather than
    averaging them itself each step: a cnn with cnn_downsample > 1 and no augmentations (those work on the
    full-size image)."""
    return hp.model == "cnn" and hp.cnn_downsample > 1 and not hp.augmentations


def downsampled_view(cnn: keras.Model, hp: HParams) -> keras.Model:
    """The cnn from its "downsampled" layer on, fed each image's k x k square sums (input_pipeline.downsampled_images):
    a scaling by 1 / k^2 stands for the average pooling, then the cnn's own layers. It shares their weights, so
    training it trains the cnn, which is what is kept, exported and served (on full-size images)."""
    k = hp.cnn_downsample
    side = hp.image_size // k
    inputs = keras.Input((side, side, hp.channels), name="sums")
    x = keras.layers.Rescaling(1.0 / (k * k), name="averaged")(inputs)
    names = [layer.name for layer in cnn.layers]
    for layer in cnn.layers[names.index("downsampled") + 1 :]:
        x = layer(x)
    return keras.Model(inputs, x, name=f"{cnn.name}_downsampled")


def make_backbone(hp: HParams, weights_file: Optional[str] = None) -> keras.Model:
    """The frozen backbone, with hp.weights ("imagenet", a file, or "" for random
    initialisation), or with `weights_file` (local or gs://), the weights the features step saved."""
    weights = weights_file or hp.weights or None
    if weights and weights != "imagenet":
        with local_file(weights) as local:
            return _backbone(hp, local)
    return _backbone(hp, weights)


def _backbone(hp: HParams, weights: Optional[str]) -> keras.Model:
    shape = (hp.image_size, hp.image_size, hp.channels)
    if hp.model == efficientnet_lite.NAME:
        backbone = _efficientnet_lite(shape, weights)
    elif hp.model == "mobilenet_v2":
        backbone = keras.applications.MobileNetV2(input_shape=shape, include_top=False, weights=weights)
    else:
        backbone = keras.applications.EfficientNetB0(input_shape=shape, include_top=False, weights=weights)
    backbone.trainable = False
    return backbone


def _efficientnet_lite(shape, weights: Optional[str]) -> keras.Model:
    """EfficientNet-Lite0 with weights: "imagenet" (the installed package's file, its checksum checked), a .pth
    file of the same network, or a Keras weights file (the features cache's)."""
    backbone = efficientnet_lite.build(shape)
    if weights == "imagenet":
        weights = efficientnet_lite.packaged_weights()
        efficientnet_lite.check_packaged(weights)
    if weights and weights.endswith(".pth"):
        efficientnet_lite.load_pth(backbone, weights)
    elif weights:
        backbone.load_weights(weights)
    return backbone


def _scaled(hp: HParams, inputs):
    """Pixels in 0..255 as the backbone expects them: part of the model, so serving scales the same way."""
    if hp.model == efficientnet_lite.NAME:  # the reference's (x - 127) / 128
        return keras.layers.Rescaling(
            1 / efficientnet_lite.STDDEV, offset=-efficientnet_lite.MEAN / efficientnet_lite.STDDEV
        )(inputs)
    if hp.model == "mobilenet_v2":
        return keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)  # MobileNetV2 wants -1..1
    return inputs  # EfficientNet rescales and normalises inside


def backbone_of(model: keras.Model):
    return next((layer for layer in model.layers if isinstance(layer, keras.Model)), None)


def unfreeze_top(model: keras.Model, layers: int) -> int:
    """Phase two of transfer learning: unfreezes the backbone's top layers (not BatchNorm)."""
    backbone = backbone_of(model)
    backbone.trainable = True
    unfrozen = 0
    for index, layer in enumerate(backbone.layers):
        trainable = index >= len(backbone.layers) - layers and not isinstance(layer, keras.layers.BatchNormalization)
        layer.trainable = trainable
        unfrozen += trainable
    return unfrozen


class _MeanOverClasses(keras.metrics.Metric):
    """The mean over the classes with examples of a per-example value averaged within each class (_values):
    every class counts alike, whatever its count. Its sums are summed across replicas."""

    def __init__(self, num_classes: int, name: str, **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = num_classes
        self.seen = self.add_variable(shape=(num_classes,), initializer="zeros", name="seen", aggregation="sum")
        self.total = self.add_variable(shape=(num_classes,), initializer="zeros", name="total", aggregation="sum")

    def _values(self, labels, y_pred):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        actual = ops.one_hot(labels, self.num_classes, dtype="float32")  # an id out of range counts nowhere
        if sample_weight is not None:  # an example of weight 0 (padding) counts nowhere either
            actual = actual * ops.reshape(ops.cast(sample_weight, "float32"), (-1, 1))
        self.seen.assign_add(ops.sum(actual, axis=0))
        self.total.assign_add(ops.sum(actual * self._values(labels, y_pred)[:, None], axis=0))

    def result(self):
        present = ops.cast(self.seen > 0, "float32")
        mean = ops.divide_no_nan(self.total, ops.maximum(self.seen, 1.0))
        return ops.divide_no_nan(ops.sum(mean * present), ops.sum(present))

    def reset_state(self):
        self.seen.assign(keras.ops.zeros_like(self.seen))
        self.total.assign(keras.ops.zeros_like(self.total))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes}


class BalancedAccuracy(_MeanOverClasses):
    """The mean recall of the classes with examples (macro-averaged recall), on argmax predictions: what
    training follows on imbalanced data (trainer/class_balance.py), where accuracy rewards a model that calls
    everything the majority class."""

    def __init__(self, num_classes: int, name: str = "balanced_accuracy", **kwargs):
        super().__init__(num_classes, name, **kwargs)

    def _values(self, labels, y_pred):
        return ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), labels), "float32")


class BalancedCrossEntropy(_MeanOverClasses):
    """The mean over the classes with examples of each class's mean cross-entropy: a loss in which every class
    counts alike, reported beside the loss (TensorBoard, training.json). Nothing stops on it: early stopping on
    imbalanced data follows balanced accuracy (on a class-balanced loss it did worse on the long tail:
    docs/benchmarks.md, Imbalanced classes)."""

    def __init__(self, num_classes: int, name: str = "balanced_loss", **kwargs):
        super().__init__(num_classes, name, **kwargs)

    def _values(self, labels, y_pred):
        actual = ops.one_hot(labels, self.num_classes, dtype="float32")
        return -ops.log(ops.clip(ops.sum(actual * ops.cast(y_pred, "float32"), axis=-1), 1e-7, 1.0))


class WeightedBinaryCrossEntropy(keras.losses.Loss):
    """Binary cross-entropy of each label, its positive examples weighted by the label's weight
    (class_balance.positive_weights: a rare label's few positives weigh as much as its negatives), averaged over
    the labels: the multi-label loss."""

    def __init__(self, positive_weights, name: str = "weighted_binary_crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.positive_weights = [float(w) for w in positive_weights]

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "float32")
        p = ops.clip(ops.cast(y_pred, "float32"), 1e-7, 1.0 - 1e-7)
        weights = ops.convert_to_tensor(self.positive_weights, dtype="float32")
        return ops.mean(-(weights * y_true * ops.log(p) + (1.0 - y_true) * ops.log(1.0 - p)), axis=-1)

    def get_config(self):
        return {**super().get_config(), "positive_weights": self.positive_weights}


def compile_model(
    model: keras.Model,
    hp: HParams,
    positive_weights=None,
    fine_tuning: bool = False,
    metrics: bool = True,
    steps_per_call: int = 1,
) -> None:
    """Adam at hp's learning rate (its fine-tuning one when `fine_tuning`: the backbone's top layers unfrozen) on
    cross-entropy; accuracy, balanced accuracy and the class-balanced loss (over the model's own
    classes) are reported. They weigh each example as the loss does: the padding of a TPU's last eval batch
    (input_pipeline.batched) counts nowhere, and with --class-balance weights the training figures are
    weighted like its loss (balanced accuracy is the same either way: a class's weight cancels in its mean).
    Without `metrics`, the loss alone (a model whose figures nothing reads); `steps_per_call` steps run in one call."""
    num_classes = model.outputs[0].shape[-1]
    learning_rate = hp.fine_tune_learning_rate if fine_tuning else hp.learning_rate
    if is_multi_label(model):  # each label on its own: weighted binary cross-entropy, macro AUC-PR followed
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss=WeightedBinaryCrossEntropy(positive_weights or [1.0] * num_classes),
            weighted_metrics=[
                keras.metrics.AUC(curve="PR", multi_label=True, num_labels=num_classes, name="auc_pr"),
                keras.metrics.BinaryAccuracy(name="binary_accuracy"),
            ]
            if metrics
            else None,
            steps_per_execution=steps_per_call,
        )
        return
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        weighted_metrics=[
            "sparse_categorical_accuracy",
            BalancedAccuracy(num_classes),
            BalancedCrossEntropy(num_classes),
        ]
        if metrics
        else None,
        steps_per_execution=steps_per_call,
    )


def set_output_bias(model: keras.Model, bias) -> None:
    """Starts the classifier's bias at `bias` (trainer/class_balance.initial_bias)."""
    layer = model.get_layer("probabilities")
    layer.bias.assign(keras.ops.convert_to_tensor(bias, dtype=layer.bias.dtype))
