"""Hyperparameter search: the tuner_fn of the Tuner step (components/tuner) and how its values reach the Trainer.

    ImageTuner(tuner_fn="trainer.search.tuner_fn", ...)   -> best_hyperparameters (KerasTuner's config)
    Trainer(hyperparameters=...)                           -> run_fn: apply(hp, values)

KerasTuner's BayesianOptimization runs `--tune N` trials, each scored by the accuracy of its best epoch on the
held-out part of the train split (trainer/holdout.py: the Trainer's; the eval split is left to the Evaluator),
or on imbalanced classes its balanced accuracy (trainer/class_balance.py:
a trial is trained with the Trainer's class balancing too). Why Bayesian: a run searches 10 to 30 trials over 4 to 6 settings,
mostly continuous (the learning rates, dropout); a Gaussian process over the finished trials puts the next
ones where the score is likely higher, which random search only does by luck at such budgets, and it keeps
`--tune N` meaning N trials (Hyperband decides its own count from epochs and a reduction factor, and its
short brackets judge a learning rate on its first epochs). The first trials are random (INITIAL_POINTS).

The space (define()), per model:

    learning_rate            log-uniform 1e-4 .. 1e-2
    dropout                  0.0 .. 0.5, by 0.1
    head_units               0, 64, 128, 256 (cnn) | 0, 128, 256, 512 (backbones): a hidden ReLU layer
    batch_size               32, 64, 128
    fine_tune_learning_rate  log-uniform 1e-6 .. 1e-4      backbones with --fine-tune-epochs only
    fine_tune_layers         10, 20, 40                     backbones with --fine-tune-epochs only

A trial trains what the Trainer would with its values, on the same records, with the same early stopping
(--epochs as the cap, --patience): the `cnn` on pixels; a transfer model's head on the features step's
cached features (a few passes over small vectors and ~3.5 s of building a model: 20 trials on 2,000
photos took 78 s, about half of one frozen training on pixels), then, with --fine-tune-epochs, its
fine-tune phase on pixels (which costs what it costs the Trainer, per trial).
"""

# The run summary and the report import this module (through components/model_card/render.py) and load no
# TensorFlow: what needs it is imported inside the functions that use it.
import dataclasses
import os
from typing import Any, Dict, Optional

from storage.progress_events import progress_event
from trainer import class_balance
from trainer.hparams import HParams

OBJECTIVE = class_balance.ACCURACY  # on imbalanced classes, class_balance.BALANCED_ACCURACY (objective_for)
ALGORITHM = "bayesian"
INITIAL_POINTS = 3  # random trials before the Gaussian process leads (at most the trial count)
SPACE_VERSION = 1  # bump when define() changes: an older search's values are then not reused
TRIALS_KEY = "tune_trials"  # in the Tuner's custom_config: how many trials (components/tuner sets it)
TUNED = ("learning_rate", "dropout", "head_units", "batch_size", "fine_tune_learning_rate", "fine_tune_layers")


def objective_for(train_counts, multi_label: bool = False) -> str:
    """What the trials are scored on: held-out accuracy, or balanced accuracy when the train split is imbalanced (a
    multi-label model's: macro AUC-PR, as the Trainer follows)."""
    if multi_label:
        return class_balance.MACRO_AUC_PR
    imbalanced = class_balance.is_imbalanced(
        dict(train_counts) if isinstance(train_counts, dict) else {str(i): n for i, n in enumerate(train_counts)}
    )
    return class_balance.BALANCED_ACCURACY if imbalanced else OBJECTIVE


def space_names(hp: HParams) -> list:
    """The settings define() searches for this configuration."""
    names = ["learning_rate", "dropout", "head_units", "batch_size"]
    if hp.model != "cnn" and hp.fine_tune_epochs > 0:
        names += ["fine_tune_learning_rate", "fine_tune_layers"]
    return names


def define(space, hp: HParams) -> None:
    """Registers the search space for hp's model in a keras_tuner.HyperParameters."""
    space.Float("learning_rate", 1e-4, 1e-2, sampling="log", default=hp.learning_rate)
    space.Float("dropout", 0.0, 0.5, step=0.1, default=round(min(0.5, hp.head_dropout), 1))
    widths = [0, 64, 128, 256] if hp.model == "cnn" else [0, 128, 256, 512]
    space.Choice("head_units", widths, default=hp.head_units if hp.head_units in widths else 0)
    space.Choice("batch_size", [32, 64, 128], default=hp.batch_size if hp.batch_size in (32, 64, 128) else 64)
    if "fine_tune_learning_rate" in space_names(hp):
        space.Float("fine_tune_learning_rate", 1e-6, 1e-4, sampling="log", default=hp.fine_tune_learning_rate)
        space.Choice(
            "fine_tune_layers", [10, 20, 40], default=hp.fine_tune_layers if hp.fine_tune_layers in (10, 20, 40) else 20
        )


def apply(hp: HParams, values: Optional[Dict[str, Any]]) -> HParams:
    """hp with the searched settings of `values` (KerasTuner's HyperParameters values) in place."""
    chosen = {k: v for k, v in (values or {}).items() if k in TUNED}
    return dataclasses.replace(hp, **chosen).validate() if chosen else hp


def values_of(config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The values of a KerasTuner HyperParameters config (what the Tuner writes, the Trainer reads)."""
    if not config:
        return {}
    import keras_tuner  # TensorFlow (~4 s): the report imports this module

    return dict(keras_tuner.HyperParameters.from_config(config).values)


class _Trials:
    """What each trial trains on: the Trainer's inputs (fn_args), read once into the datasets a trial asks for."""

    def __init__(self, fn_args, hp: HParams, plan, strategy):
        import tensorflow_transform as tft  # TensorFlow (~4 s): the report imports this module

        from trainer import features, holdout, training  # import TensorFlow, as above

        self.hp = hp
        # The Trainer's device plan and strategy (trainer/strategy.py): trials train where it trains, with its
        # global batch (a batch per replica) and its mixed-precision policy.
        self.plan, self.strategy = plan, strategy
        output = tft.TFTransformOutput(fn_args.transform_graph_path)
        self.num_classes = output.vocabulary_size_by_name(features.LABEL_VOCABULARY)
        # Multi-label examples: the Trainer's sigmoid model, weighted loss and macro AUC-PR objective.
        self.multi_label = features.is_multi_label(output.transformed_feature_spec())
        self.multi_hot = self.num_classes if self.multi_label else 0
        self.source = training.features_source(fn_args.train_files) if hp.model != "cnn" else None
        self.train_files = fn_args.train_files
        # The Trainer's held-out part of the train split (trainer/holdout.py: the same images, by their hash and
        # the seed): trials are scored on it, never on the eval split the Evaluator judges with.
        self.holdout = holdout.choose(self.train_files, self.num_classes, self.multi_label, hp.seed)
        self.parts = {
            "train": holdout.Part(self.holdout, held=False),
            "held_out": holdout.validation_part(self.holdout),
        }
        # The Trainer's class balancing, and the metric it follows (a trial's values must not be judged on data
        # the Trainer then treats otherwise).
        self.balancing, self.balance = training.balance_of(
            hp, self.holdout, [str(i) for i in range(self.num_classes)], self.multi_label
        )
        self.positive_weights = self.balancing.get("positive_weights")
        self.objective = self.balancing["monitor"]
        self._records = {}  # (split, on features) -> input_pipeline.Records: one count and one cache for all trials

    def pixel_files(self):
        """The train split's pixels (a transfer model's: the Transform output its features were computed from)."""

        if not self.source:
            return self.train_files
        return [os.path.join(self.source["transformed_examples"], "Split-train", "*")]

    def records(self, part: str, on_features: bool):
        """A part's records ("train": the training part, "held_out": the held-out part of the train split), counted
        once and held in memory once (when they fit) for every trial: the features, or the cnn's pixels. A transfer
        model's fine-tune phase reads its pixels trial by trial, as before (held beside the features, they would
        take a second cache budget)."""
        from trainer import input_pipeline  # TensorFlow (~4 s): the report imports this module

        if not on_features and self.source:
            return None
        key = (part, on_features)
        if key not in self._records:
            files = self.train_files if on_features else self.pixel_files()
            self._records[key] = input_pipeline.read_records(files, self.hp, self.parts[part])
        return self._records[key]

    def datasets(self, hp: HParams, on_features: bool):
        from trainer import input_pipeline  # TensorFlow (~4 s): the report imports this module

        batching = input_pipeline.Batching(
            hp.batch_size * self.strategy.num_replicas_in_sync, self.plan.static_shapes, self.multi_hot
        )
        train_records, eval_records = self.records("train", on_features), self.records("held_out", on_features)
        if on_features:
            train = input_pipeline.make_feature_dataset(
                self.train_files,
                hp,
                self.source,
                training=True,
                batching=batching,
                balance=self.balance,
                shared_records=train_records,
                part=self.parts["train"],
            )
            evaluation = input_pipeline.make_feature_dataset(
                self.train_files,
                hp,
                self.source,  # the held-out train records hold the augmented views too: the plain one is read
                training=False,
                batching=batching,
                shared_records=eval_records,
                part=self.parts["held_out"],
            )
        else:
            train = input_pipeline.make_dataset(
                self.pixel_files(),
                hp,
                training=True,
                batching=batching,
                balance=self.balance,
                shared_records=train_records,
                part=self.parts["train"],
            )
            evaluation = input_pipeline.make_dataset(
                self.pixel_files(),
                hp,
                training=False,
                batching=batching,
                shared_records=eval_records,
                part=self.parts["held_out"],
            )
        train, steps = input_pipeline.repeated(train)
        return train, steps, evaluation


def _hypermodel(trials: _Trials):
    import keras  # TensorFlow (~4 s): the report imports this module
    import keras_tuner

    from trainer import models  # imports TensorFlow, as above
    from trainer import strategy as strategies

    class ImageHyperModel(keras_tuner.HyperModel):
        """The Trainer's model and training for a trial's values (a transfer model: its head on features)."""

        def build(self, space):
            hp = apply(trials.hp, space.values)
            keras.utils.set_random_seed(hp.seed)  # every trial starts from the same draw: only its values differ
            with strategies.policy(trials.plan.mixed_precision_policy):  # KerasTuner builds in the strategy's scope
                if trials.source:
                    model = models.head(trials.num_classes, trials.source["dim"], hp, trials.multi_label)
                else:
                    model = models.build(hp, trials.num_classes, multi_label=trials.multi_label)
                models.set_output_bias(model, trials.balancing["initial_bias"])
                models.compile_model(model, hp, trials.positive_weights)
            return model

        def fit(self, space, model, *args, callbacks=None, **kwargs):
            from trainer.training import early_stopping  # TensorFlow (~4 s): the report imports this module

            hp = apply(trials.hp, space.values)
            stop = early_stopping(hp, trials.objective, restore_best_weights=True)
            train, steps, evaluation = trials.datasets(hp, on_features=bool(trials.source))
            history = model.fit(
                train,
                steps_per_epoch=steps,
                validation_data=evaluation,
                epochs=hp.epochs,
                callbacks=list(callbacks or []) + [stop],
                verbose=0,
            )
            if not (trials.source and hp.fine_tune_epochs > 0):
                return history
            return _fine_tune_trial(trials, hp, model)

    return ImageHyperModel()


def _fine_tune_trial(trials: _Trials, hp: HParams, head) -> dict:
    """A transfer model's trial after its head's phase: {objective: its best value while fine-tuning}."""
    from trainer import models  # TensorFlow (~4 s): the report imports this module
    from trainer import strategy as strategies
    from trainer.training import early_stopping

    # The fine-tune phase, as the Trainer runs it: the head into the whole model, the top layers unfrozen.
    with trials.strategy.scope(), strategies.policy(trials.plan.mixed_precision_policy):
        whole = models.build(
            hp, trials.num_classes, models.make_backbone(hp, trials.source["backbone_weights"]), trials.multi_label
        )
        models.copy_head(head, whole)
        models.unfreeze_top(whole, hp.fine_tune_layers)
        models.compile_model(whole, hp, trials.positive_weights, fine_tuning=True)
    train, steps, evaluation = trials.datasets(hp, on_features=False)
    stop = early_stopping(hp, trials.objective, restore_best_weights=True)
    tuned = whole.fit(
        train,
        steps_per_epoch=steps,
        validation_data=evaluation,
        epochs=hp.fine_tune_epochs,
        callbacks=[stop],
        verbose=0,
    )
    return {trials.objective: max(tuned.history[trials.objective])}


def trial_plan(hp: HParams):
    """The Trainer's device plan (trainer/strategy.py), on one machine: a Vertex tuning job's replicas (TF_CONFIG
    names them) run parallel trials, each alone, not one trial together."""
    from trainer import strategy as strategies  # TensorFlow (~4 s): the report imports this module

    one_machine = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return strategies.plan(hp.mixed_precision, required=hp.required_device, environ=one_machine)


def _search_class():
    import keras_tuner  # TensorFlow (~4 s): the report imports this module

    class Search(keras_tuner.BayesianOptimization):
        """KerasTuner's Bayesian optimisation, telling `imagepipe run` each finished trial and the best score."""

        def on_trial_end(self, trial):
            super().on_trial_end(trial)
            scores = [t.score for t in self.oracle.trials.values() if t.score is not None]
            done = sum(t.status in ("COMPLETED", "INVALID", "FAILED") for t in self.oracle.trials.values())
            progress_event(
                "tune",
                done,
                self.oracle.max_trials,
                best=max(scores) if scores else 0.0,
                objective=self.oracle.objective.name,
            )

    return Search


def tuner_fn(fn_args):
    """TFX's Tuner entry point: the KerasTuner tuner of fn_args.custom_config's trials over define()'s space."""
    import keras_tuner  # TensorFlow (~4 s): the report imports this module
    from tfx.components.tuner.component import TunerFnResult

    from trainer import strategy as strategies  # imports TensorFlow, as above

    hp = HParams.from_custom_config(fn_args.custom_config)
    trials = int((fn_args.custom_config or {}).get(TRIALS_KEY) or 10)
    space = keras_tuner.HyperParameters()
    define(space, hp)
    plan = trial_plan(hp)  # before TensorFlow starts
    strategy = strategies.make(plan)
    trials_data = _Trials(fn_args, hp, plan, strategy)
    tuner = _search_class()(
        distribution_strategy=strategy,
        hypermodel=_hypermodel(trials_data),
        objective=keras_tuner.Objective(trials_data.objective, "max"),
        max_trials=trials,
        num_initial_points=min(trials, INITIAL_POINTS),
        hyperparameters=space,
        tune_new_entries=False,
        seed=hp.seed,
        directory=fn_args.working_dir,
        project_name="search",
        overwrite=True,
    )
    return TunerFnResult(tuner=tuner, fit_kwargs={})
