"""What a training run takes from its data and settings, the same for run_fn (trainer/task.py) and each of the
Tuner's trials (trainer/search.py): where its examples came from, what it does about the class mix, when it stops."""

import json
import os
import statistics
import time
from typing import Optional, Tuple

import keras
import tensorflow as tf
from absl import logging

from trainer import class_balance, input_pipeline, model_trials
from trainer.artifact_files import FEATURES_SOURCE_FILE
from trainer.epochs import held_out_figure
from trainer.holdout import Holdout
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
    hp: HParams, holdout: Holdout, class_names, multi_label: bool = False
) -> Tuple[dict, Optional[input_pipeline.Balance]]:
    """What training does about the class mix of its training part (the train split less the held-out images:
    trainer/holdout.py; trainer/class_balance.py): the plan training.json records, and the input pipeline's
    balancing (None: none; multi-label: rare labels are weighed in the loss)."""
    counts = list(holdout.train_counts)
    if multi_label:
        balancing = class_balance.multi_label_plan(hp.class_balance, counts, holdout.train_examples, class_names)
        if balancing["mode"] == "weights":
            logging.info(
                "Trainer: rare labels (%s of %d images): positive weights %s",
                class_balance.describe_mix(balancing["counts"]),
                holdout.train_examples,
                balancing["positive_weights"],
            )
        return balancing, None
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


class StopWhenSettled(keras.callbacks.Callback):
    """Stops a phase once the held-out figure its epoch is kept by (`monitor`: accuracy, or balanced accuracy on
    imbalanced classes, or macro AUC-PR) has not improved for `patience` epochs, counted from `start_from_epoch`.

    With `follow_loss` (balanced classes), a lower held-out loss also counts as progress while the figure is below
    its ceiling: accuracy moves in steps and often rises again after a flat stretch in which the loss falls
    (bench/shapes.py: lowest loss at epoch 10, accuracy 0.24; at epoch 14, 0.29). At the ceiling (1.0) nothing
    can improve it: training stops `patience` epochs later (a clean set no longer trains to --epochs).
    `restore_best_weights`: the weights of the best epoch are put back when training ends (the Tuner's trials)."""

    def __init__(
        self,
        monitor: str,
        patience: int,
        start_from_epoch: int = 0,
        follow_loss: bool = True,
        restore_best_weights: bool = False,
    ):
        super().__init__()
        self.monitor, self.patience, self.start_from_epoch = monitor, patience, start_from_epoch
        self.follow_loss, self.restore_best_weights = follow_loss, restore_best_weights

    def on_train_begin(self, logs=None):
        self.wait, self.best, self.best_loss, self.best_weights = 0, -float("inf"), float("inf"), None
        self.stopped_epoch = 0

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        value, loss = logs.get(self.monitor), logs.get("val_loss")
        if value is None:
            return
        improved = value > self.best
        if improved:
            self.best = value
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
        if self.follow_loss and loss is not None and loss < self.best_loss:
            improved = improved or self.best < 1.0
            self.best_loss = loss
        if epoch < self.start_from_epoch:
            return
        self.wait = 0 if improved else self.wait + 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch + 1
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.restore_best_weights and self.best_weights is not None:
            self.model.set_weights(self.best_weights)


def early_stopping(hp: HParams, monitor: str, restore_best_weights: bool = False) -> keras.callbacks.Callback:
    """Within the cap (--epochs), training stops once the held-out figure it keeps its epoch by has settled
    (StopWhenSettled): on balanced classes accuracy and loss, --patience epochs.

    On imbalanced data it follows balanced accuracy alone (a lower loss there mostly means the majority class
    fits better), which moves in steps of a few rare images: it waits twice --patience, and only from the
    end of the first --patience epochs, while a balanced loss is still learning the rare class (measured on
    bench/imbalanced.py's 2% set: flat for 12 epochs, best at 17; --patience 5 from epoch 1 kept epoch 1)."""
    if monitor == class_balance.ACCURACY:
        return StopWhenSettled(monitor, hp.patience, restore_best_weights=restore_best_weights)
    return StopWhenSettled(
        monitor,
        2 * hp.patience,
        start_from_epoch=hp.patience,
        follow_loss=False,
        restore_best_weights=restore_best_weights,
    )


class TrialStop(keras.callbacks.Callback):
    """Stops a --model auto candidate (trainer/model_trials.py) when another epoch as long as the last would end past
    `deadline` (a time.monotonic() value: --auto-trial-minutes), or once its held-out curve (`monitor`) shows it
    cannot pass `target` in the epochs left (model_trials.cannot_catch_up, its pace over `window` epochs). `why`
    says which ("" while it has not stopped it)."""

    def __init__(self, deadline: float, target: Optional[float] = None, monitor: str = "", window: int = 5):
        super().__init__()
        self.deadline, self.target, self.monitor, self.window = deadline, target, monitor, window
        self.curve, self.why = [], ""

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        now = time.monotonic()
        took = now - self._started
        if now + took > self.deadline:
            self.why = "stopped at --auto-trial-minutes"
        elif self.target is not None:
            self.curve.append(held_out_figure(logs or {}, self.monitor))
            left = min(int((self.deadline - now) // max(took, 1e-9)), self.params["epochs"] - epoch - 1)
            self.why = model_trials.cannot_catch_up(self.curve, self.target, left, self.window)
        if self.why:
            self.model.stop_training = True


def seconds_per_batch_read(dataset) -> float:
    """The seconds a batch of a pace probe's dataset takes to read the first time (from the files, into the probe's
    own cache; training.seconds_per_step then times steps from memory), after its first batch (which opens the files
    and starts the pipeline: at 100,000 images, timed with the others, it made the estimate of the cnn's reading
    ~4 times what its epochs took): what a candidate's first epoch spends on each batch filling the cache."""
    times = []
    for _ in dataset:
        times.append(time.perf_counter())
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0


def seconds_per_step(model: keras.Model, dataset, steps: int) -> float:
    """The median seconds of `steps` training steps of `model` on a repeated `dataset`, after one untimed step (which
    traces it): what a candidate costs on this machine (trainer/model_trials.py). The model trains on those batches."""
    times = []

    class _Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self._started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self._started)

    model.fit(dataset, steps_per_epoch=steps + 1, epochs=1, callbacks=[_Clock()], verbose=0)
    return statistics.median(times[1:])
