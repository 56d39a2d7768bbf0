"""Training hyperparameters: what Transform and the Trainer read from their custom_config.

The training settings a user gives are declared here once (settings.setting()): PipelineConfig's fields and the
`imagepipe run` options are made from these declarations. pipeline/config.py builds the custom_config dict from
the configuration; here it is parsed (with defaults), so that run_fn and preprocessing_fn agree on it.
"""

import dataclasses
import math
import os
from typing import Any, Dict, Optional

from settings import SEED, any_of, checked, declared, items, setting
from trainer import operating_point
from trainer.class_balance import ACCURACY_THRESHOLD, IMBALANCED_RATIO, MIN_CLASS_RECALL
from trainer.class_balance import MODES as BALANCE_MODES

MODELS = ("cnn", "efficientnet_lite0", "mobilenet_v2", "efficientnet_b0")
BACKBONES = MODELS[1:]  # pretrained backbones: features cached, a head trained on them, then optional fine-tuning
# --model auto (the default): the run chooses from its images (pipeline/model_choice.py) and says why.
AUTO = "auto"
AUGMENTATIONS = ("flip", "crop", "brightness")
TFLITE_KINDS = ("float16", "int8")  # on-device exports (trainer/tflite_export.py)
EXPORT_KINDS = ("onnx", "coreml")  # exports for other runtimes (trainer/model_exports.py)
MIXED_PRECISION_MODES = ("auto", "on", "off")  # trainer/strategy.py
# Input side each model is usually trained at; the sample digits use 32.
DEFAULT_IMAGE_SIZE = {"cnn": 64, "efficientnet_lite0": 224, "mobilenet_v2": 224, "efficientnet_b0": 224}
SAMPLE_IMAGE_SIZE = 32  # the digits sample's images are 8x8: the cnn's usual 64 would only upsample them more
MAX_IMAGE_SIZE = 1024  # 3 MB of uint8 pixels per image in Transform's output
MAX_EPOCHS = 10_000
MAX_HEAD_UNITS = 4096
MAX_BATCH_SIZE = 65536


def _whole(least: int, most: int):
    """A declared check (settings.setting()): a whole number in a range."""
    return (lambda v: least <= v <= most, f"use a whole number from {least} to {most:,}")


# A learning rate's check (settings.setting()); the fine-tuning one, a plain field, is checked with it.
_LEARNING_RATE = (lambda v: math.isfinite(v) and 0 < v <= 10, "use a number above 0 and at most 10 (e.g. 0.001)")


DEFAULT_DROPOUT = {"cnn": 0.3}  # the backbones' head: TRANSFER_DROPOUT
TRANSFER_DROPOUT = 0.2


def describe_model(model: str, weights: str, choice: str = "") -> str:
    """The model, its weights, and why --model auto chose it (HParams.model_choice): for the run's first line, its
    summary and the model card."""
    if model in BACKBONES:
        model += (
            ", pretrained on ImageNet"
            if weights == "imagenet"
            else ", random weights"
            if not weights
            else f", weights {os.path.basename(weights)}"
        )
    return model + (f" (--model auto: {choice})" if choice else "")


@dataclasses.dataclass(frozen=True)
class HParams:
    model: str = setting(
        AUTO,
        "auto (photo-sized images: efficientnet_lite0 pretrained on ImageNet, its head against the small cnn and its "
        "top layers fine-tuned, compared on held-out train images within --auto-trial-minutes; small images: the "
        "small cnn; the run says which and why), cnn, or a pretrained backbone for transfer learning; default "
        "{default}",
        (AUTO,) + MODELS,
    )
    # Why the model is what it is, when --model auto chose it (pipeline/model_choice.py, then the Trainer's trials:
    # trainer/model_trials.py): the summary says it.
    model_choice: str = ""
    # --model auto on photo-sized images: the Trainer also trains the small cnn and the backbone with its top layers
    # fine-tuned, and keeps whichever is best on the held-out train images (trainer/model_trials.py).
    auto_trial_minutes: int = setting(
        10,
        "--model auto on photo-sized images: the most minutes the Trainer spends training the other candidates (the "
        "small cnn, the backbone's top layers fine-tuned) to compare with the backbone's head on held-out train "
        "images; a candidate whose measured pace would pass it is not tried (0: the head alone; default {default})",
        check=_whole(0, 24 * 60),
    )
    # The cnn averages cnn_downsample x cnn_downsample pixels first (1: none): --model auto's cnn candidate works at
    # about its usual 64 px on the backbone's 224 px input (trainer/model_trials.py).
    cnn_downsample: int = 1
    # None: the model's usual input side (DEFAULT_IMAGE_SIZE; pipeline/config.py gives the digits sample its own).
    image_size: Optional[int] = setting(
        None,
        f"side of the square model input (default: {SAMPLE_IMAGE_SIZE} for the sample, else the model's usual: "
        + ", ".join(
            f"{size} for {' and '.join(m for m in MODELS if DEFAULT_IMAGE_SIZE[m] == size)}"
            for size in sorted(set(DEFAULT_IMAGE_SIZE.values()))
        )
        + ")",
    )
    channels: int = 3
    # The backbones' weights: "imagenet" (efficientnet_lite0's come with an installed package, keras.applications
    # downloads the others'), a .h5 or .weights.h5 file (local or gs://; a .pth for efficientnet_lite0), or "" for
    # random initialisation (tests of speed; nothing downloads).
    weights: str = setting(
        "imagenet",
        "backbones: 'imagenet' (installed with efficientnet_lite0, downloaded for the "
        "others), a weights file (local or gs://), or '' (random); default {default}",
    )
    # The most epochs: training stops earlier, once the held-out figure it keeps its epoch by has not improved for
    # `patience` epochs, and keeps its best epoch (trainer/epochs.py). For transfer models: the epochs with the
    # backbone frozen.
    epochs: int = setting(
        100,
        "the most training epochs: training stops earlier once its held-out accuracy (balanced accuracy on "
        "imbalanced classes) and loss have not improved for --patience epochs, keeping the best epoch "
        "(default {default})",
        check=_whole(1, MAX_EPOCHS),
        runtime=True,
    )
    fine_tune_epochs: int = setting(
        0,
        "backbones: then at most this many epochs with the top layers unfrozen (default {default}: none)",
        check=(lambda v: 0 <= v <= MAX_EPOCHS, f"use 0 to {MAX_EPOCHS:,}"),
    )
    fine_tune_layers: int = 20  # how many of the backbone's top layers to unfreeze
    batch_size: int = setting(64, "per replica (default {default})", check=_whole(1, MAX_BATCH_SIZE))
    learning_rate: float = setting(1e-3, "(default {default})", check=_LEARNING_RATE, runtime=True)
    # The head: dropout before the classifier (None: 0.3 for the cnn, 0.2 for the backbones' head), and the
    # width of a hidden ReLU layer before it (0: none, the classifier sits on the features).
    dropout: Optional[float] = None
    head_units: int = 0
    fine_tune_learning_rate: float = 1e-5
    patience: int = setting(
        5,
        "epochs without a better held-out figure before training stops (default {default})",
        check=(lambda v: 1 <= v <= MAX_EPOCHS, f"use a whole number of epochs from 1 to {MAX_EPOCHS:,}"),
    )
    augment: str = setting(
        "", "training augmentation: any of " + ",".join(AUGMENTATIONS), check=any_of(AUGMENTATIONS)
    )  # comma-separated
    # Transfer models with --augment: augmented views of each training image whose backbone features the
    # features step caches beside the plain one; each epoch of the frozen phase draws one per image.
    augment_views: int = 4
    tflite: str = setting(
        "",
        f"also export TensorFlow Lite models for devices: any of {','.join(TFLITE_KINDS)} "
        "(scored on the held-out train images next to the SavedModel)",
        check=any_of(TFLITE_KINDS),
    )  # comma-separated
    exports: str = setting(
        "",
        f"also export the model for other runtimes: any of {','.join(EXPORT_KINDS)} (beside the "
        "SavedModel; ONNX scored on the held-out train images next to it)",
        check=any_of(EXPORT_KINDS),
    )  # comma-separated
    seed: int = setting(
        SEED,
        "the run's random seed: the order files are ingested in, initial weights, augmentation (default {default})",
        check=_whole(0, 2**32 - 1),  # what NumPy and TensorFlow accept as a seed
    )
    # TensorFlow's op determinism: the same data, settings and seed give the same weights (docs/retraining.md:
    # Reproducible training has its cost); False trades that for speed.
    deterministic: bool = setting(
        True,
        "allow nondeterministic TensorFlow ops (faster on some GPUs; by default the "
        "same data, settings and seed give the same model)",
        flag="--nondeterministic",
    )
    # Start from the base model's weights when it has the same classes and shape.
    warm_start: bool = setting(False, "start training from the latest blessed model (same classes and model)")
    # Imbalanced classes (trainer/class_balance.py): auto (loss weights by class when the train split's largest
    # class has over 3 times the images of its smallest), weights, sampling (class-balanced batches), off.
    class_balance: str = setting(
        "auto",
        f"imbalanced classes (the largest over {IMBALANCED_RATIO:g} times the "
        "smallest in train): auto (loss weights by class, and training follows balanced "
        "accuracy), weights, sampling (class-balanced batches), off; default {default}",
        BALANCE_MODES,
    )
    # How the trained model decides (trainer/operating_point.py): chosen on held-out train data, against the gate's
    # accuracy threshold and class recall floor (gate_accuracy, gate_min_class_recall: the Evaluator's settings, which
    # pipeline/config.py copies here).
    operating_point: str = setting(
        operating_point.AUTO,
        operating_point.RULE_HELP,
        check=(operating_point.check, "use auto, argmax, or class recall floors as 'CLASS>=R[,CLASS>=R]'"),
    )
    gate_accuracy: float = ACCURACY_THRESHOLD
    gate_min_class_recall: float = MIN_CLASS_RECALL
    mixed_precision: str = setting(
        "auto",
        "auto (default: float16 on GPUs, bfloat16 on TPUs, none on CPUs), on (bfloat16 on a CPU), off",
        MIXED_PRECISION_MODES,
    )  # trainer/strategy.py
    # "tpu": the Trainer was sent to a TPU (--training-tpu), and fails if none is reachable; "": whatever is there.
    required_device: str = ""
    # Cache the records in memory when they are smaller than this; 0: a quarter of this machine's memory.
    cache_megabytes: int = 0

    def __post_init__(self):
        if self.image_size is None:
            object.__setattr__(self, "image_size", DEFAULT_IMAGE_SIZE.get(self.model, DEFAULT_IMAGE_SIZE["cnn"]))

    @classmethod
    def from_custom_config(cls, custom_config: Optional[Dict[str, Any]]) -> "HParams":
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in (custom_config or {}).items() if k in known and v is not None}
        return cls(**given).validate()

    def to_custom_config(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def transform_config(self) -> Dict[str, Any]:
        """What preprocessing_fn reads, and only that: Transform's cached output stays valid when a
        training setting (epochs, learning rate, ...) changes."""
        return {"image_size": self.image_size, "channels": self.channels}

    def features_config(self) -> Dict[str, Any]:
        """What the features step (components/features) reads: the backbone, its input and weights
        (the seed makes random weights), and the augmented views to cache."""
        return {
            "model": self.model,
            "image_size": self.image_size,
            "channels": self.channels,
            "weights": self.weights,
            "seed": self.seed,
            "augment": self.augment,
            "augment_views": self.augment_views,
        }

    def health_config(self) -> Dict[str, Any]:
        """What the data health check reads (components/health): the input, and for the cnn's opt-in
        k-fold label check the model's training settings."""
        return {
            "model": self.model,
            "image_size": self.image_size,
            "channels": self.channels,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "learning_rate": self.learning_rate,
        }

    def cache_limit_megabytes(self) -> float:
        if self.cache_megabytes:
            return self.cache_megabytes
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 / 4
        except (ValueError, OSError, AttributeError):  # pragma: no cover
            return 1024

    @property
    def head_dropout(self) -> float:
        return self.dropout if self.dropout is not None else DEFAULT_DROPOUT.get(self.model, TRANSFER_DROPOUT)

    @property
    def augmentations(self):
        return items(self.augment)

    @property
    def tflite_kinds(self):
        return items(self.tflite)

    @property
    def export_kinds(self):
        return items(self.exports)

    def validate(self) -> "HParams":
        """One-line errors that name the option (as `imagepipe run` spells it) and the accepted range."""
        checked(self, declared(HParams))  # each declared setting's choices and range
        return self.validate_together()

    def validate_together(self) -> "HParams":
        """What the settings need of each other (PipelineConfig.validate has checked each declared one already)."""
        if self.channels not in (1, 3):
            raise ValueError(f"channels {self.channels}: use 1 or 3")
        if self.model in BACKBONES and self.channels != 3:
            raise ValueError(f"{self.model} needs channels=3")
        smallest = 32 if self.model in BACKBONES else 8  # the backbones need 32+ (auto: checked once chosen)
        if not smallest <= self.image_size <= MAX_IMAGE_SIZE:
            raise ValueError(
                f"--image-size {self.image_size}: use {smallest} to {MAX_IMAGE_SIZE} pixels for "
                f"{self.model} (Transform stores size x size x 3 bytes per image)"
            )
        if self.required_device not in ("", "tpu"):
            raise ValueError(f"required_device {self.required_device!r}: use '' or 'tpu'")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError(
                f"dropout {self.dropout} (a hyperparameter the Tuner sets): use a fraction from 0 to below 1"
            )
        if not 0 <= self.head_units <= MAX_HEAD_UNITS:
            raise ValueError(
                f"head_units {self.head_units} (a hyperparameter the Tuner sets): use 0 (none) to {MAX_HEAD_UNITS:,}"
            )
        if not 1 <= self.cnn_downsample <= 16 or self.image_size // self.cnn_downsample < 8:
            raise ValueError(
                f"cnn_downsample {self.cnn_downsample}: use 1 to 16, leaving the cnn at least 8 px of its "
                f"{self.image_size} px input"
            )
        if not 1 <= self.augment_views <= 64:
            raise ValueError(f"augment_views {self.augment_views}: use 1 to 64 views")
        if not _LEARNING_RATE[0](self.fine_tune_learning_rate):
            raise ValueError(f"fine_tune_learning_rate {self.fine_tune_learning_rate}: {_LEARNING_RATE[1]}")
        return self
