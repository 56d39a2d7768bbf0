"""The Trainer's run_fn: Trainer(run_fn="trainer.task.run_fn", custom_config=HParams...).

Chooses the device strategy (trainer/strategy.py), trains on Transform's records
(two phases for the transfer models), writes TensorBoard logs and training.json
(per-epoch metrics, times, strategy, hyperparameters) to the model run folder, and
exports the serving SavedModel (trainer/export.py), with --tflite the TFLite models
beside it (trainer/tflite_export.py, in a child process; their scores go into
training.json). In a multi-worker cluster every worker trains and exports (saving
takes every replica), and only the chief writes where the pipeline reads: the
others write to a scratch folder they delete, then wait for the chief's model.
"""

import copy
import dataclasses
import json
import os
import shutil
import tempfile
import time
import warnings
from typing import NamedTuple, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from absl import logging
from tensorflow.python.framework import config as tf_config  # disable_op_determinism is not public

from storage.progress_events import progress_event
from storage.relocation import pipeline_root_of, relocate
from trainer import (
    class_balance,
    export,
    features,
    head_export,
    holdout,
    input_pipeline,
    model_trials,
    models,
    operating_point,
    search,
    tflite_export,
)
from trainer import strategy as strategies
from trainer.artifact_files import (
    FEATURE_PROFILE_FILE,
    INFO_FILE,
    KERAS_DIR,
    LABEL_THRESHOLDS_FILE,
    TRAINING_LOG,
    WEIGHTS_FILE,
)
from trainer.epochs import best_epoch, held_out_figure, still_improving
from trainer.hparams import HParams
from trainer.training import (
    TrialStop,
    balance_of,
    early_stopping,
    features_source,
    seconds_per_batch_read,
    seconds_per_step,
)


class EpochLog(keras.callbacks.Callback):
    """A training phase: keeps each epoch's metrics and duration, logs them as they come, and when the
    phase ends restores the weights of its best epoch (trainer/epochs.py)."""

    def __init__(
        self,
        phase: str,
        total_epochs: int,
        cap: int = 0,
        option: str = "--epochs",
        monitor: str = class_balance.ACCURACY,
        patience: int = 5,
    ):
        super().__init__()
        self.phase = phase
        self.total_epochs = total_epochs
        self.cap, self.option = cap, option  # this phase's most epochs, and the option that sets it
        # the held-out metric whose best epoch is kept (balanced accuracy on imbalanced data: trainer/holdout.py)
        self.monitor, self.patience = monitor, patience
        self.epochs = []
        self._best_weights = None

    def still_improving(self) -> bool:
        return still_improving(self.epochs, self.cap, self.monitor, self.patience)

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        entry = {
            "epoch": epoch + 1,
            "phase": self.phase,
            "seconds": round(time.monotonic() - self._started, 2),
            **{k: float(v) for k, v in (logs or {}).items()},
        }
        self.epochs.append(entry)
        if best_epoch(self.epochs, self.monitor) is entry:
            self._best_weights = self.model.get_weights()
        logging.info(
            "Trainer: epoch %d (%s) %s",
            epoch + 1,
            self.phase,
            ", ".join(f"{k}={v:.4f}" for k, v in entry.items() if isinstance(v, float)),
        )
        # what training follows besides the loss (balanced accuracy, or multi-label's macro AUC-PR), by its name
        followed = (
            {}
            if self.monitor not in entry or self.monitor == class_balance.ACCURACY
            else {self.monitor: entry[self.monitor]}
        )
        progress_event(
            "train",
            epoch + 1,
            self.total_epochs,
            loss=entry.get("loss", 0.0),  # for `imagepipe run`
            val_accuracy=entry.get("val_sparse_categorical_accuracy", entry.get("val_binary_accuracy", 0.0)),
            **followed,
        )

    def on_train_end(self, logs=None):
        if self._best_weights is not None:
            self.model.set_weights(self._best_weights)


def _train_head_on_features(model, inputs: "_Inputs", callbacks) -> None:
    """The frozen phase of a transfer model: the head alone on the features step's cached backbone output
    (an epoch is a pass over small vectors, not the backbone over every image), then into the model. It trains
    on the training part of the train split and validates on its held-out part (trainer/holdout.py)."""
    hp, source = inputs.hp, inputs.source
    train_files = inputs.fn_args.train_files
    batching = input_pipeline.Batching(inputs.batch, inputs.static, inputs.multi_hot)
    train, steps = input_pipeline.repeated(
        input_pipeline.make_feature_dataset(
            train_files, hp, source, training=True, batching=batching, balance=inputs.balance, part=inputs.training
        )
    )
    # held-out train records hold the augmented views too: validation reads the plain one
    validation = input_pipeline.make_feature_dataset(
        train_files, hp, source, training=False, batching=batching, part=inputs.validation
    )
    if isinstance(inputs.strategy, tf.distribute.MultiWorkerMirroredStrategy):
        train = input_pipeline.sharded_across_workers(
            train,
            input_pipeline.list_files(train_files),
            inputs.plan.workers,
            training=True,
            sampling=inputs.balance is not None and inputs.balance.mode == "sampling",
        )
        validation = input_pipeline.sharded_across_workers(validation, [], inputs.plan.workers, training=False)
    with inputs.strategy.scope():
        head = models.head(inputs.num_classes, source["dim"], hp, inputs.multi_label)
        models.copy_head(model, head)  # the model's initial (or warm-started) head
        models.compile_model(head, hp, inputs.balancing.get("positive_weights"))
    logging.info(
        "Trainer: training the head on cached features (%d a vector, %d views an image)",
        source["dim"],
        input_pipeline.train_views(source),
    )
    head.fit(train, steps_per_epoch=steps, validation_data=validation, epochs=hp.epochs, callbacks=callbacks, verbose=0)
    models.copy_head(head, model)


def warm_start(model, base_model_dir, info, serving_model_dir: str = "") -> Tuple[Optional[str], str]:
    """Loads the base model's weights when it was trained for the same classes and input.

    Returns (the weights' folder, "") or (None, why training starts from scratch). The base model is
    looked for where the root now is (storage/relocation.py), from this run's serving_model_dir.
    """
    if not base_model_dir:
        return None, "no blessed model yet"
    model_dir = os.path.dirname(base_model_dir.rstrip("/"))
    if serving_model_dir:
        model_dir = relocate(model_dir, pipeline_root_of(os.path.dirname(serving_model_dir.rstrip("/"))))
    keras_dir = os.path.join(model_dir, KERAS_DIR)
    info_path = os.path.join(keras_dir, INFO_FILE)
    if not tf.io.gfile.exists(info_path):
        return None, "the last blessed model has no Keras weights"
    with tf.io.gfile.GFile(info_path) as f:
        base = json.load(f)
    if base.get("class_names") != info["class_names"]:
        return None, "the last blessed model was trained on other classes"
    if base != info:
        changed = ", ".join(
            f"{k} {base.get(k)} -> {info.get(k)}" for k in sorted(set(base) | set(info)) if base.get(k) != info.get(k)
        )
        return None, f"the last blessed model differs ({changed})"
    _load_weights(model, keras_dir)
    return keras_dir, ""


def _load_weights(model, folder: str) -> None:
    with models.local_file(os.path.join(folder, WEIGHTS_FILE)) as local:
        model.load_weights(local)


def _export_on_device(
    hp: HParams,
    num_classes: int,
    class_names,
    weights_file: str,
    pixel_files,
    scored: holdout.Part,
    serving_model_dir,
    multi_label: bool = False,
) -> dict:
    """{"tflite": the TFLite models and their accuracy, "exports": ONNX and Core ML (trainer/model_exports.py)}, each
    {'error'} when the child failed: the SavedModel is what the pipeline serves, so a conversion that fails (an op
    a converter lacks) is reported, not a reason to discard the training."""
    try:
        record = tflite_export.export_in_child(
            hp, num_classes, class_names, weights_file, pixel_files, scored, serving_model_dir, multi_label
        )
    except tflite_export.TFLiteExportError as e:
        logging.warning("Trainer: the exports failed: %s", e)
        return {
            **({"tflite": {"error": str(e)}} if hp.tflite_kinds else {}),
            **({"exports": {kind: {"error": str(e)} for kind in hp.export_kinds}} if hp.export_kinds else {}),
        }
    logging.info("Trainer: exports %s", record)
    return record


def run_fn(fn_args) -> None:
    # The Tuner's best values (--tune: trainer/search.py) replace the settings they searched.
    tuned = search.values_of(getattr(fn_args, "hyperparameters", None))
    hp = search.apply(HParams.from_custom_config(fn_args.custom_config), tuned)
    if tuned:
        logging.info("Trainer: the Tuner's values: %s", tuned)
    keras.utils.set_random_seed(hp.seed)  # Python, NumPy and TensorFlow
    was_deterministic = tf_config.is_op_determinism_enabled()
    if hp.deterministic:
        tf.config.experimental.enable_op_determinism()
    plan = strategies.plan(hp.mixed_precision, required=hp.required_device)
    strategy = strategies.make(plan)
    replicas = strategy.num_replicas_in_sync
    logging.info("Trainer: training on %s", plan.describe(replicas))
    try:
        with strategies.policy(plan.mixed_precision_policy):
            _train_and_export(fn_args, hp, plan, strategy, tuned)
    finally:
        if not was_deterministic:
            tf_config.disable_op_determinism()


class _Inputs:
    """What a training run's steps share: the Transform output's classes, the examples' files, the batch and the
    class balance."""

    def __init__(self, fn_args, hp: HParams, plan: strategies.Plan, strategy: tf.distribute.Strategy):
        self.fn_args, self.hp, self.plan, self.strategy = fn_args, hp, plan, strategy
        self.replicas = strategy.num_replicas_in_sync
        self.tft_output = tft.TFTransformOutput(fn_args.transform_output)
        self.num_classes = self.tft_output.vocabulary_size_by_name(features.LABEL_VOCABULARY)
        # Multi-label examples (ImageExampleGen --task multi): a sigmoid per label, weighted binary cross-entropy.
        self.multi_label = features.is_multi_label(self.tft_output.transformed_feature_spec())
        self.multi_hot = self.num_classes if self.multi_label else 0
        self.batch = hp.batch_size * self.replicas
        self.static = plan.static_shapes  # XLA on TPU compiles one batch shape (eval: padded with weightless examples)
        # Transfer models train on the features step's output: their frozen phase on the cached features; the
        # pixels (fine-tuning, TFLite) are in the Transform output that step read.
        self.source = features_source(fn_args.train_files) if hp.model != "cnn" else None
        # The train split's pixels: the Trainer reads no other split (the eval split is the Evaluator's alone).
        self.pixel_files = (
            fn_args.train_files
            if not self.source
            else [os.path.join(self.source["transformed_examples"], "Split-train", "*")]
        )
        self.class_names = [n.decode() for n in self.tft_output.vocabulary_by_name(features.LABEL_VOCABULARY)]
        # What training validates on, early stopping to the operating point: a stratified part of the train split
        # (trainer/holdout.py), the same images in the features and the pixels.
        self.holdout = holdout.choose(fn_args.train_files, self.num_classes, self.multi_label, hp.seed)
        self.training = holdout.Part(self.holdout, held=False)
        self.validation = holdout.validation_part(self.holdout)
        logging.info(
            "Trainer: validating on %d held-out train images (%d train)",
            self.holdout.held_examples,
            self.holdout.train_examples,
        )
        self.balancing, self.balance = balance_of(hp, self.holdout, self.class_names, self.multi_label)
        self.monitor = self.balancing["monitor"]
        self.read = {}  # each part's pixel records, read and cached once for every dataset on them (pixels())
        # The images averaged down once instead (models.trains_downsampled: --model auto's cnn candidate)
        self.downsampled = False

    @property
    def on_features(self) -> bool:
        """Whether the first phase trains a backbone's head on the features step's cached features; else the model
        trains on pixels (the cnn, --model auto's cnn candidate too)."""
        return self.source is not None and self.hp.model != "cnn"

    def with_hp(self, hp: HParams) -> "_Inputs":
        """The same inputs for other settings (--model auto's candidates: trainer/model_trials.py)."""
        other = copy.copy(self)
        other.hp = hp
        return other

    def pixels(self, training: bool, probe: int = 0):
        """The training part's pixels, or the held-out part's, batched (and spread over a cluster's workers); with
        self.downsampled, their images averaged down (input_pipeline.downsampled_images). `probe`: a pace probe's
        batches, held on their own (input_pipeline.make_dataset).

        On one machine every dataset of a part shares one cache of its records (input_pipeline.read_records, as the
        Tuner's trials do): --model auto's trials and the fine-tuning read the files once, not once each (measured:
        0.09 GB less at 2,000 images, docs/benchmarks.md; a pace probe reads its few batches on its own). A cluster's
        worker reads its own shard."""
        part = self.training if training else self.validation
        multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        batching = input_pipeline.Batching(self.batch, self.static, self.multi_hot, self.downsampled)
        key = (training, self.downsampled)
        if not multi_worker and key not in self.read:  # copies of these inputs (with_hp) share self.read
            self.read[key] = input_pipeline.read_records(self.pixel_files, self.hp, part, batching)
        dataset = input_pipeline.make_dataset(
            self.pixel_files,
            self.hp,
            training=training,
            batching=batching,
            balance=self.balance,
            shared_records=None if multi_worker else self.read[key],
            part=part,
            probe=probe,
        )
        if not multi_worker:
            return dataset
        return input_pipeline.sharded_across_workers(
            dataset,
            input_pipeline.list_files(self.pixel_files) if training else [],
            self.plan.workers,
            training,
            sampling=self.balance is not None and self.balance.mode == "sampling",
        )

    def info(self) -> dict:
        hp = self.hp
        return {
            "class_names": self.class_names,
            "model": hp.model,
            "image_size": hp.image_size,
            "channels": hp.channels,
            **({"cnn_downsample": hp.cnn_downsample} if hp.cnn_downsample > 1 else {}),
            # a hidden head layer changes the weights' shapes (recorded only when there is one: older models lack it)
            **({"head_units": hp.head_units} if hp.head_units else {}),
            **({"task": "multi"} if self.multi_label else {}),
        }  # the Evaluator, predict and the card read it


def _train_and_export(
    fn_args, hp: HParams, plan: strategies.Plan, strategy: tf.distribute.Strategy, tuned: dict
) -> None:
    inputs = _Inputs(fn_args, hp, plan, strategy)
    model, warm_started, cold_reason = _build_model(
        fn_args, hp, strategy, inputs.source, inputs.num_classes, inputs.multi_label, inputs.balancing, inputs.info()
    )
    # Each phase keeps the weights of its best epoch (EpochLog). Only the chief writes the pipeline's outputs;
    # another worker of a cluster writes its logs and export to a scratch folder it deletes.
    scratch = None if plan.is_chief else tempfile.mkdtemp(prefix="imagepipe-worker-")
    logs_dir = fn_args.model_run_dir if plan.is_chief else os.path.join(scratch, "logs")
    callbacks = [keras.callbacks.TensorBoard(log_dir=logs_dir), early_stopping(hp, inputs.monitor)]
    started = time.monotonic()
    phases = _train_phases(model, inputs, callbacks)
    trials = None
    # --model auto on photo-sized images: the cnn and the fine-tuned backbone against the head, on held-out images
    not_compared = model_trials.applies(hp, bool(tuned), bool(warm_started), plan.workers, inputs.holdout.held_examples)
    if not not_compared:
        model, phases, trials = _compare_models(model, phases, inputs, time.monotonic() - started)
        hp = inputs.hp  # the kept candidate's settings, from here on
    elif hp.model_choice:
        logging.info("Trainer: --model auto: %s, by the size rule (%s)", hp.model, not_compared)
    seconds = time.monotonic() - started
    info = inputs.info()
    # How the model decides, and its probabilities' temperature, chosen on the held-out images and folded into its
    # last layer: every export decides alike (trainer/operating_point.py). Every worker does it alike.
    decision = _choose_operating_point(model, inputs, phases[0], warm_started)

    # Every worker saves (saving a distributed model may take every replica's part: TensorFlow's documented
    # pattern); only the chief's copy is kept.
    export.export(
        model, inputs.tft_output, hp, fn_args.serving_model_dir if plan.is_chief else os.path.join(scratch, "model")
    )
    if not plan.is_chief:
        shutil.rmtree(scratch, ignore_errors=True)
        wait_for_chief(fn_args, plan)
        return
    on_device = _keep_model_files(fn_args, hp, model, info, inputs, decision)
    trained = _Trained(phases, seconds, trials, decision, on_device)
    record = _training_record(inputs, tuned, warm_started, cold_reason, trained)
    tf.io.gfile.makedirs(fn_args.model_run_dir)
    with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir, TRAINING_LOG), "w") as f:
        f.write(json.dumps(record, indent=1))


def _train_phases(model, inputs: _Inputs, callbacks) -> list:
    """The first phase (a transfer model's head on cached features, else the whole model on pixels), then a
    transfer model's fine-tuning; returns their EpochLogs."""
    hp = inputs.hp
    planned = hp.epochs + (hp.fine_tune_epochs if hp.model != "cnn" else 0)
    phases = [
        EpochLog(
            "frozen backbone" if hp.model != "cnn" else "train",
            planned,
            hp.epochs,
            monitor=inputs.monitor,
            patience=hp.patience,
        )
    ]
    if inputs.on_features:
        _train_head_on_features(model, inputs, callbacks + [phases[0]])
    else:
        train, steps = input_pipeline.repeated(inputs.pixels(training=True))
        model.fit(
            train,
            steps_per_epoch=steps,
            validation_data=inputs.pixels(training=False),
            epochs=hp.epochs,
            callbacks=callbacks + [phases[0]],
            verbose=0,
        )
    if hp.model != "cnn" and hp.fine_tune_epochs > 0:
        phases.append(_fine_tune(model, inputs, callbacks, planned, done=len(phases[0].epochs)))
    return phases


def _cnn_trial(inputs: _Inputs, budget: "model_trials.Budget", trials: list) -> tuple:
    """The small cnn as a candidate, at about its usual input size: (its trial, model, phases and settings; the
    model and phases None when it was not tried)."""
    hp = inputs.hp
    cnn_hp = model_trials.cnn_hparams(hp)
    trial = model_trials.Trial(model_trials.CNN, f"the cnn ({hp.image_size // cnn_hp.cnn_downsample} px)")
    trial.note, cnn, cnn_phases = model_trials.unbeatable(trials), None, None
    if not trial.note:
        cnn_inputs = inputs.with_hp(cnn_hp)
        # Its images averaged down once, cached on their own (an eighth of the pixels' memory at 224 px) and freed
        # with cnn_inputs after the trial (the winner's held-out images are read again, at full size).
        cnn_inputs.downsampled, cnn_inputs.read = models.trains_downsampled(cnn_hp), {}
        with inputs.strategy.scope():
            cnn = models.build(cnn_hp, inputs.num_classes, multi_label=inputs.multi_label)
            models.set_output_bias(cnn, inputs.balancing["initial_bias"])
            models.compile_model(cnn, cnn_hp, inputs.balancing.get("positive_weights"))
            trained = models.downsampled_view(cnn, cnn_hp) if cnn_inputs.downsampled else cnn
            if trained is not cnn:
                models.compile_model(trained, cnn_hp, inputs.balancing.get("positive_weights"))
        cnn_phases = _trial(
            trial, trials, trained, cnn_inputs, budget, lambda extra: _train_phases(trained, cnn_inputs, extra)
        )
    return trial, cnn, cnn_phases, cnn_hp


def _compare_models(model, phases: list, inputs: _Inputs, head_seconds: float):
    """--model auto on photo-sized images (trainer/model_trials.py): the trained backbone's head against the small
    cnn and the backbone's top layers fine-tuned, each scored on the held-out images, those whose measured pace fits
    --auto-trial-minutes. Returns (the kept model, its phases, the trials' record); inputs.hp becomes its settings."""
    hp, monitor = inputs.hp, inputs.monitor
    budget = model_trials.Budget(hp.auto_trial_minutes)
    first = model_trials.Trial(
        model_trials.FINE_TUNED if hp.fine_tune_epochs else model_trials.HEAD,
        f"{hp.model} fine-tuned" if hp.fine_tune_epochs else f"{hp.model}'s head",
    )
    _scored(first, phases[-1], head_seconds)
    trials, kept = [first], [(model, phases, hp)]

    trial, cnn, cnn_phases, cnn_hp = _cnn_trial(inputs, budget, trials)
    trials.append(trial)
    kept.append((cnn, cnn_phases, cnn_hp))

    if not hp.fine_tune_epochs:  # the head's model with its top layers unfrozen
        tuned_hp, tuned, head_weights = model_trials.fine_tuned_hparams(hp), None, None
        trial = model_trials.Trial(model_trials.FINE_TUNED, f"{hp.model} fine-tuned")
        trial.note = model_trials.unbeatable(trials)
        if not trial.note:
            tuned_inputs = inputs.with_hp(tuned_hp)
            head_weights = model.get_weights()
            _unfreeze(model, tuned_inputs)
            planned, done = len(phases[0].epochs) + tuned_hp.fine_tune_epochs, len(phases[0].epochs)
            tuned = _trial(
                trial,
                trials,
                model,
                tuned_inputs,
                budget,
                lambda extra: [_fine_tune(model, tuned_inputs, extra, planned, done, unfrozen=True)],
            )
        trials.append(trial)
        kept.append((model, phases + tuned if tuned else None, tuned_hp))
        if head_weights is not None and model_trials.winner(trials) != len(trials) - 1:
            model.set_weights(head_weights)  # the head's model as it was before fine-tuning (or its pace measured)
    best = model_trials.winner(trials)
    described = model_trials.describe(trials, best, class_balance.figure_name(monitor), inputs.holdout.held_examples)
    logging.info("Trainer: --model auto %s", described)
    chosen, chosen_phases, chosen_hp = kept[best]
    inputs.hp = dataclasses.replace(chosen_hp, model_choice=described)
    return (
        chosen,
        chosen_phases,
        {
            "size_rule": hp.model_choice,
            "budget_minutes": hp.auto_trial_minutes,
            "figure": monitor,
            "candidates": [t.record() for t in trials],
            "kept": trials[best].name,
        },
    )


def _trial(
    trial: model_trials.Trial, before: list, model, inputs: _Inputs, budget: model_trials.Budget, train
) -> Optional[list]:
    """One candidate: its pace measured (training.seconds_per_step), then trained by `train(callbacks)` when its
    MIN_EPOCHS fit in what is left of the budget, stopping at the budget or once it cannot beat the candidates
    `before` it (model_trials.cannot_catch_up); returns its phases (None: not tried)."""
    started = time.monotonic()
    probe = inputs.pixels(training=True, probe=model_trials.PROBE_STEPS + 1)
    read = seconds_per_batch_read(probe)
    step = seconds_per_step(model, input_pipeline.repeated(probe)[0], model_trials.PROBE_STEPS)
    epochs, held = model_trials.MIN_EPOCHS[trial.name], inputs.holdout
    estimated = model_trials.estimate(step, read, inputs.batch, held.train_examples, held.held_examples, epochs)
    trial.estimated = estimated
    if estimated > budget.left():
        trial.note = model_trials.not_tried(epochs, estimated, budget.left())
        logging.info("Trainer: --model auto: %s %s", trial.label, trial.note)
        return None
    stop = TrialStop(budget.deadline, model_trials.catch_up_target(before), inputs.monitor, inputs.hp.patience)
    phases = train([early_stopping(inputs.hp, inputs.monitor), stop])
    _scored(trial, phases[-1], time.monotonic() - started)
    trial.note = stop.why
    return phases


class _Trained(NamedTuple):
    """What training did: its phases (EpochLogs), the seconds they took, --model auto's trials (None: no
    comparison), the operating point chosen, the on-device exports written."""

    phases: list
    seconds: float
    trials: Optional[dict]
    decision: dict
    on_device: dict


def _training_record(inputs: _Inputs, tuned: dict, warm_started, cold_reason: str, trained: _Trained) -> dict:
    """training.json: the strategy, settings, classes, each epoch's metrics and the exports."""
    hp, plan, source, replicas = inputs.hp, inputs.plan, inputs.source, inputs.replicas
    phases, on_device = trained.phases, trained.on_device
    return {
        "strategy": plan.describe(replicas),
        "device_kind": plan.kind,
        "replicas": replicas,
        # Multi-worker: the cluster's machines (TF_CONFIG), this one the chief.
        "workers": plan.workers,
        "hparams": hp.to_custom_config(),
        "num_classes": inputs.num_classes,
        "class_names": inputs.class_names,
        "tuned": tuned or None,  # the settings the Tuner's best trial chose (in hparams too)
        "warm_started_from": warm_started,
        "warm_start_skipped": cold_reason,
        "deterministic": hp.deterministic,
        "train_seconds": round(trained.seconds, 2),
        "epochs": [e for p in phases for e in p.epochs],
        # The options whose epoch cap ended a phase that was still improving (raise them).
        "still_improving": [p.option for p in phases if p.still_improving()],
        "tflite": on_device.get("tflite"),
        "exports": on_device.get("exports"),  # ONNX, Core ML (trainer/model_exports.py)
        # The train split's class mix and what training did about it (trainer/class_balance.py).
        "class_balance": inputs.balancing,
        # Transfer models: the frozen phase trained the head on the features step's cached features.
        "features": {k: source[k] for k in ("fingerprint", "dim", "views")} if source else None,
        # What every choice above was measured on: a stratified part of the train split (trainer/holdout.py).
        "held_out": inputs.holdout.record(inputs.class_names),
        # How the model decides and its temperature, or a multi-label model's label thresholds
        # (trainer/operating_point.py)
        "operating_point": trained.decision,
        # --model auto's candidates on photo-sized images, each scored on the held-out images (trainer/model_trials.py)
        "model_trials": trained.trials,
    }


def _build_model(
    fn_args,
    hp: HParams,
    strategy: tf.distribute.Strategy,
    source: Optional[dict],
    num_classes: int,
    multi_label: bool,
    balancing: dict,
    info: dict,
):
    """The compiled model in the strategy's scope, warm-started when asked and possible:
    (model, the model it started from or None, why it did not)."""
    with strategy.scope():
        backbone = models.make_backbone(hp, source["backbone_weights"]) if source else None
        model = models.build(hp, num_classes, backbone, multi_label)
        models.set_output_bias(model, balancing["initial_bias"])
        warm_started, cold_reason = (
            warm_start(model, fn_args.base_model, info, fn_args.serving_model_dir) if hp.warm_start else (None, "")
        )
        if warm_started:
            logging.info("Trainer: warm-started from %s", warm_started)
        elif hp.warm_start:
            logging.warning("Trainer: not warm-starting (%s); training from scratch", cold_reason)
        models.compile_model(model, hp, balancing.get("positive_weights"))
    return model, warm_started, cold_reason


def _scored(trial: model_trials.Trial, phase: "EpochLog", seconds: float) -> None:
    """A trained candidate's held-out figure at its kept epoch and after each epoch, its epochs and seconds."""
    best = best_epoch(phase.epochs, phase.monitor)
    trial.figure = held_out_figure(best, phase.monitor)
    trial.epochs, trial.kept_epoch, trial.seconds = len(phase.epochs), int(best["epoch"]), round(seconds, 1)
    trial.curve = [round(held_out_figure(epoch, phase.monitor), 4) for epoch in phase.epochs]


def _unfreeze(model, inputs: _Inputs) -> None:
    """The backbone's top layers made trainable, the model compiled at the fine-tuning learning rate."""
    hp, balancing = inputs.hp, inputs.balancing
    with inputs.strategy.scope():
        unfrozen = models.unfreeze_top(model, hp.fine_tune_layers)
        models.compile_model(model, hp, balancing.get("positive_weights"), fine_tuning=True)
    logging.info("Trainer: fine-tuning the top %d backbone layers", unfrozen)


def _fine_tune(model, inputs: _Inputs, callbacks, planned: int, done: int, unfrozen: bool = False) -> EpochLog:
    """Transfer models' second phase: the backbone's top layers unfrozen (unless they are), on pixels, after `done`
    epochs."""
    hp, balancing, pixels = inputs.hp, inputs.balancing, inputs.pixels
    if not unfrozen:
        _unfreeze(model, inputs)
    phase = EpochLog(
        "fine-tune",
        planned,
        hp.fine_tune_epochs,
        "--fine-tune-epochs",
        monitor=balancing["monitor"],
        patience=hp.patience,
    )
    train, steps = input_pipeline.repeated(pixels(training=True))
    model.fit(
        train,
        steps_per_epoch=steps,
        validation_data=pixels(training=False),
        initial_epoch=done,
        epochs=done + hp.fine_tune_epochs,
        callbacks=callbacks + [phase],
        verbose=0,
    )
    return phase


def _keep_model_files(fn_args, hp: HParams, model, info: dict, inputs: _Inputs, decision: dict):
    """Beside the SavedModel (the chief only): the Keras weights and what they fit (warm starts, TFLite), the
    TFLite and other exports, the features' profile; returns the exports' record ({"tflite", "exports"})."""
    source = inputs.source
    keras_dir = os.path.join(os.path.dirname(fn_args.serving_model_dir), KERAS_DIR)
    tf.io.gfile.makedirs(keras_dir)
    weights = models.save_weights(model, os.path.join(keras_dir, WEIGHTS_FILE))  # local: the child reads it
    try:
        on_device = (
            _export_on_device(
                hp,
                len(inputs.class_names),
                inputs.class_names,
                weights,
                inputs.pixel_files,
                inputs.validation,  # the exports are scored on the held-out images
                fn_args.serving_model_dir,
                inputs.multi_label,
            )
            if hp.tflite_kinds or hp.export_kinds
            else {}
        )
    finally:
        models.discard_staged(weights)
    with tf.io.gfile.GFile(os.path.join(keras_dir, INFO_FILE), "w") as f:
        f.write(json.dumps(info))
    if inputs.on_features and not hp.fine_tune_epochs and not inputs.multi_label:  # its backbone: the features step's
        head_export.export_head(model, hp, inputs.num_classes, source, os.path.dirname(keras_dir))
    if "thresholds" in decision:  # multi-label: what the Evaluator judges each label at
        with tf.io.gfile.GFile(os.path.join(keras_dir, LABEL_THRESHOLDS_FILE), "w") as f:
            f.write(json.dumps(decision))
    if source:  # the features the model learnt from, in profile: what the next run's drift is measured against
        profile = os.path.join(source["uri"], FEATURE_PROFILE_FILE)
        if tf.io.gfile.exists(profile):
            tf.io.gfile.copy(profile, os.path.join(keras_dir, FEATURE_PROFILE_FILE), overwrite=True)
    return on_device


def _held_out_probabilities(model, inputs: _Inputs, fine_tuned: bool):
    """(probabilities [images, classes], labels [images]) of the held-out images, by a copy of the model outside
    the strategy (plain calls, any device): the head on the cached features when the head was the last thing
    trained, else the whole model on pixels. Held in memory: a fifth of the train split's labels and
    probabilities (20,000 images of 100 classes: 8 MB)."""
    hp, source = inputs.hp, inputs.source
    if inputs.on_features and not fine_tuned:
        scorer = models.head(inputs.num_classes, source["dim"], hp, inputs.multi_label)
        models.copy_head(model, scorer)
        dataset = input_pipeline.make_feature_dataset(  # the plain view is read
            inputs.fn_args.train_files,
            hp,
            source,
            training=False,
            batching=input_pipeline.Batching(multi_hot=inputs.multi_hot),
            part=inputs.validation,
        )
    else:
        backbone = models.make_backbone(hp, source["backbone_weights"]) if inputs.on_features else None
        scorer = models.build(hp, inputs.num_classes, backbone, inputs.multi_label)
        scorer.set_weights(model.get_weights())
        dataset = input_pipeline.make_dataset(
            inputs.pixel_files,
            hp,
            training=False,
            batching=input_pipeline.Batching(multi_hot=inputs.multi_hot),
            shared_records=inputs.read.get((False, False)),  # the held-out pixels training validated on, when cached
            part=inputs.validation,
        )
    probabilities, labels = [], []
    for x, y in dataset:
        # predict_on_batch runs the model as one traced function: called eagerly, op by op, a fine-tuned
        # EfficientNet-Lite0's batch of 64 at 224 px held 5.4 GB at once (traced: 0.7 GB, and 1.5x faster)
        probabilities.append(np.asarray(scorer.predict_on_batch(x), dtype=np.float64))
        labels.append(y.numpy())
    if not probabilities:
        return np.zeros([0, inputs.num_classes]), np.zeros([0, inputs.num_classes] if inputs.multi_label else [0])
    return np.concatenate(probabilities), np.concatenate(labels)


# The operating point of a head trained on cached features is chosen on out-of-fold predictions of the whole train
# split (OUT_OF_FOLD heads, each trained on the other folds for the kept epoch's count): every rare image counts, not
# a fifth of them. Measured on bench/decision_benchmark.py's rare-1 (32 defects, 6 held out): see docs/benchmarks.md.
OUT_OF_FOLD = 5
# ... when the train split's features fit in memory at once for it (Lite0's 1,280 floats: 5 KB an image, 100 MB);
# past it, on the held-out images.
OUT_OF_FOLD_LIMIT = 20_000


def _train_features(inputs: _Inputs):
    """(the plain view's features [images, dim], labels [images]) of the whole train split, in memory."""
    source = inputs.source
    dataset = input_pipeline.make_feature_dataset(inputs.fn_args.train_files, inputs.hp, source, training=False)
    vectors, labels = [], []
    for x, y in dataset:
        vectors.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(vectors), np.concatenate(labels)


# A head fitted outside the Trainer's epochs (out-of-fold, the refit) runs its steps this many to a call: Keras's
# per-step overhead was much of its time (with no metrics either: nothing reads them; the same weights to the bit).
FIT_STEPS_PER_CALL = 32


class _HeadFits:
    """Heads trained on these features as the Trainer trains one (its class weights, initial bias, learning rate,
    batch), outside any strategy: the folds' and the refit. Each fit starts from what a new head made with its seed
    starts from (the weights, the dropout's random state) and from a new optimizer's state, put into one compiled
    head: the same weights to the bit as a new head each (checked), while Keras traces its train and predict steps
    once instead of once a head (the five folds: about half their time)."""

    def __init__(self, hp: HParams, num_classes: int, dim: int, balancing: dict):
        self.hp, self.num_classes, self.dim, self.balancing = hp, num_classes, dim, balancing
        self._head = self._new_head()
        models.compile_model(self._head, hp, metrics=False, steps_per_call=FIT_STEPS_PER_CALL)
        self._head.optimizer.build(self._head.trainable_variables)
        self._optimizer_start = [variable.numpy() for variable in self._head.optimizer.variables]

    def _new_head(self):
        head = models.head(self.num_classes, self.dim, self.hp)
        models.set_output_bias(head, self.balancing["initial_bias"])
        return head

    def fit(self, vectors, labels, epochs: int, seed: int):
        """The head trained on `vectors` for `epochs` from `seed` (valid until the next fit)."""
        hp, balancing = self.hp, self.balancing
        counts = np.bincount(labels[labels >= 0], minlength=self.num_classes)
        # class-balanced batches are weighed as loss weights here (the same in expectation)
        weights = balancing.get("weights") or (
            class_balance.loss_weights(list(counts)) if balancing["mode"] == "sampling" else None
        )
        keras.utils.set_random_seed(seed)
        for variable, start in zip(self._head.variables, self._new_head().variables, strict=True):
            variable.assign(start)
        for variable, start in zip(self._head.optimizer.variables, self._optimizer_start, strict=True):
            variable.assign(start)
        # The epochs as one stream of batches, reshuffled each epoch (a last short batch each, as Keras's): Keras makes
        # a new iterator of its input each epoch, which was most of a fold's time (3x as fast; other shuffles than
        # Keras's).
        weighed = (
            np.asarray(weights, np.float32)[np.clip(labels, 0, None)] if weights else np.ones(len(labels), np.float32)
        )
        batches = (
            tf.data.Dataset.from_tensor_slices((vectors, labels, weighed))
            .shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)
            .batch(hp.batch_size)
            .repeat(epochs)
        )
        self._head.fit(batches, epochs=1, shuffle=False, verbose=0)  # shuffled above (Keras warns of its own)
        return self._head


def _out_of_fold(inputs: _Inputs, fits: _HeadFits, vectors, labels, epochs: int):
    """(the probabilities of every train image from a head that did not train on it, the folds): OUT_OF_FOLD
    stratified folds (scikit-learn's StratifiedKFold), each head trained on the others."""

    # scikit-learn (~0.4 s): only out-of-fold predictions (a small train split, on features) use it
    from sklearn.model_selection import StratifiedKFold

    probabilities = np.zeros([len(labels), inputs.num_classes])
    # StratifiedKFold refuses more folds than the largest class has images (a tiny set: as many as it has, from 2)
    splits = min(OUT_OF_FOLD, int(np.bincount(labels[labels >= 0]).max()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a class of fewer images than folds: StratifiedKFold says so, and copes
        folds = list(StratifiedKFold(splits, shuffle=True, random_state=inputs.hp.seed).split(vectors, labels))
    for fold, (fitted, held) in enumerate(folds):
        head = fits.fit(vectors[fitted], labels[fitted], epochs, inputs.hp.seed + fold)
        probabilities[held] = head.predict(vectors[held], batch_size=1024, verbose=0)
    return probabilities, splits


def _model_on_held_out(held, offsets, num_classes: int) -> dict:
    """The trained model itself on its held-out images, at its argmax and as it decides now (what the kept epoch was
    measured on, whatever the rule was chosen on)."""
    probabilities, labels = held
    known = (labels >= 0) & (labels < num_classes)
    logits = operating_point.log_probabilities(probabilities[known])
    return {
        "images": int(known.sum()),
        "argmax": operating_point.figures(labels[known], logits.argmax(1), num_classes),
        "chosen": operating_point.figures(labels[known], (logits + np.asarray(offsets)).argmax(1), num_classes),
    }


def _choose_operating_point(model, inputs: _Inputs, first_phase: "EpochLog", warm_started=None) -> dict:
    """The single-label model's decision rule and temperature, chosen on the held-out images (a head on cached
    features: on out-of-fold predictions of the whole train split) and folded into its last layer; a multi-label
    model's threshold per label, chosen on the held-out images (trainer/operating_point.py)."""
    hp = inputs.hp
    fine_tuned = hp.model != "cnn" and hp.fine_tune_epochs > 0
    if inputs.multi_label:
        probabilities, hot = (
            _held_out_probabilities(model, inputs, fine_tuned)
            if not inputs.holdout.empty
            else (np.zeros([0, inputs.num_classes]), np.zeros([0, inputs.num_classes]))
        )
        thresholds = operating_point.label_thresholds(probabilities, hot, inputs.class_names)
        logging.info("Trainer: %s", operating_point.describe(thresholds))
        return thresholds
    images = inputs.holdout.train_examples + inputs.holdout.held_examples
    chosen_on = f"{inputs.holdout.held_examples:,} held-out train images"
    held = (
        _held_out_probabilities(model, inputs, fine_tuned)
        if not inputs.holdout.empty
        else (np.zeros([0, inputs.num_classes]), np.zeros([0], np.int64))
    )  # the trained model on its held-out images
    probabilities, labels = held
    refit = None
    if not inputs.holdout.empty and inputs.on_features and not fine_tuned and images <= OUT_OF_FOLD_LIMIT:
        kept = best_epoch(first_phase.epochs, inputs.monitor)["epoch"]
        vectors, labels = _train_features(inputs)
        fits = _HeadFits(hp, inputs.num_classes, inputs.source["dim"], inputs.balancing)
        probabilities, splits = _out_of_fold(inputs, fits, vectors, labels, kept)
        chosen_on = f"{splits}-fold out-of-fold predictions of all {images:,} train images"
        if not warm_started:  # refitted on every train image for the kept epoch's count (its rare images too)
            refit = fits.fit(vectors, labels, kept, inputs.hp.seed)
    decision = operating_point.choose(
        probabilities,
        labels,
        inputs.class_names,
        hp.operating_point,
        hp.gate_accuracy,
        hp.gate_min_class_recall,
        imbalanced=inputs.balancing["mode"] != "off",
    )
    decision["chosen_on"] = chosen_on
    decision["refitted"] = refit is not None
    decision["model_on_held_out"] = _model_on_held_out(held, decision["offsets"], inputs.num_classes)
    if inputs.holdout.empty:
        decision["reason"] = "nothing held out (no class has two train images): the head's argmax"
    if refit is not None:
        models.copy_head(refit, model)
        logging.info("Trainer: the head refitted on all %d train images for %d epochs", images, kept)
    layer = model.get_layer("probabilities")
    kernel, bias = layer.get_weights()
    layer.set_weights(operating_point.fold(kernel, bias, decision["offsets"], decision["temperature"]))
    logging.info("Trainer: %s", operating_point.describe(decision))
    return decision


CHIEF_WAIT_SECONDS = 6 * 3600  # a worker waits this long at most for the chief's model (a TFLite export included)


def wait_for_chief(fn_args, plan: strategies.Plan, timeout: float = CHIEF_WAIT_SECONDS) -> None:
    """A worker of a cluster: returns once the chief has written training.json, the last of its outputs (TFX then
    checks the model folder on every replica)."""
    done = os.path.join(fn_args.model_run_dir, TRAINING_LOG)
    deadline = time.monotonic() + timeout
    logging.info("Trainer: worker %s waits for the chief's model (%s)", plan.task.get("index"), done)
    while not tf.io.gfile.exists(done):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Trainer: worker {plan.task.get('index')}: the chief wrote no model in "
                f"{timeout:,.0f} s ({done} is missing); see the chief's log"
            )
        time.sleep(1.0)
