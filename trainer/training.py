"""What a training run takes from its data and settings, the same for run_fn (trainer/task.py) and each of the
Tuner's trials (trainer/search.py): where its examples came from, what it does about the class mix, when it stops."""

import json
import os
from typing import Optional, Tuple

import keras
import tensorflow as tf
from absl import logging

from trainer import class_balance, input_pipeline
from trainer.artifact_files import FEATURES_SOURCE_FILE
from trainer.hparams import HParams


def features_source(example_patterns) -> Optional[dict]:
    """The features step's source.json when the Trainer's examples are its output (transfer models), else None."""
    uri = os.path.dirname(os.path.dirname(example_patterns[0].rstrip("/")))  # <uri>/Split-train/*
    path = os.path.join(uri, FEATURES_SOURCE_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return {**json.load(f), "uri": uri}


def balance_of(
    hp: HParams, train_files, class_names, multi_label: bool = False
) -> Tuple[dict, Optional[input_pipeline.Balance]]:
    """What training does about its train split's class mix (trainer/class_balance.py): the plan training.json
    records, and the input pipeline's balancing (None: none; multi-label: rare labels are weighed in the loss)."""
    if multi_label:
        counts, examples = input_pipeline.multi_label_counts(train_files, len(class_names))
        balancing = class_balance.multi_label_plan(hp.class_balance, counts, examples, class_names)
        if balancing["mode"] == "weights":
            logging.info(
                "Trainer: rare labels (%s of %d images): positive weights %s",
                class_balance.describe_mix(balancing["counts"]),
                examples,
                balancing["positive_weights"],
            )
        return balancing, None
    counts = input_pipeline.label_counts(train_files, len(class_names))
    balancing = class_balance.plan(hp.class_balance, counts, class_names)
    if balancing["mode"] == "off":
        return balancing, None
    logging.info(
        "Trainer: imbalanced classes (%s): %s",
        class_balance.describe_mix(balancing["counts"]),
        "loss weights by class" if balancing["mode"] == "weights" else "class-balanced batches",
    )
    return balancing, input_pipeline.Balance(
        balancing["mode"], balancing["weights"] or (), balancing["shares"] or (), counts
    )


def early_stopping(hp: HParams, monitor: str) -> keras.callbacks.Callback:
    """Within the cap (--epochs), training stops once the eval loss has not improved for --patience epochs.

    On imbalanced data it follows balanced accuracy instead (a lower loss there mostly means the majority class
    fits better), which moves in steps of a few rare eval images: it waits twice --patience, and only from the
    end of the first --patience epochs, while a balanced loss is still learning the rare class (measured on
    bench/imbalanced.py's 2% set: flat for 12 epochs, best at 17; --patience 5 from epoch 1 kept epoch 1)."""
    if monitor == class_balance.ACCURACY:
        return keras.callbacks.EarlyStopping(monitor="val_loss", patience=hp.patience)
    return keras.callbacks.EarlyStopping(
        monitor=monitor, mode="max", patience=2 * hp.patience, start_from_epoch=hp.patience
    )
