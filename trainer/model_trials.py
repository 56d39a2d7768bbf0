"""--model auto, by measurement: which model the Trainer keeps on photo-sized images.

Before the DAG, the size rule (pipeline/model_choice.py) gives photo-sized images the pretrained backbone: its
features are cached and Transform stores its input size. The Trainer then trains the backbone's head (seconds on
the cached features) and, within --auto-trial-minutes, the other candidates on the same pixels:
  cnn         the small cnn, at about its usual 64 px (it averages the backbone's input down: cnn_downsample)
  fine-tuned  the head's model with the backbone's top layers unfrozen (--fine-tune-epochs, or FINE_TUNE_EPOCHS)
Each is scored as training keeps its epoch: on the held-out train images (trainer/holdout.py), by the figure the
epoch is kept by (accuracy; balanced accuracy on imbalanced classes; macro AUC-PR for multi-label). A candidate
replaces the best so far only when it beats it by more than MIN_GAIN, so a tie keeps the cheaper model.

What a candidate costs is measured, not guessed: the reading of its first batches and PROBE_STEPS training steps are
timed on this machine, and a candidate whose MIN_EPOCHS (with their held-out passes: what it needs to show its worth)
would pass what is left of the budget is not tried (the summary says so, with the estimate): on two CPU cores, past
a few thousand images for the fine-tuned backbone and 60,000-70,000 for the cnn, the head alone, by the size rule.
A candidate that is tried stops at the budget (trainer/training.py: TrialStop), its best epoch kept, or sooner once
its held-out curve shows it cannot pass the best so far by MIN_GAIN in the epochs left (cannot_catch_up).

Plain Python: the Trainer (trainer/task.py) trains; here is what it compares and says.
"""

import dataclasses
import itertools
import time
from typing import List, Optional

from trainer.hparams import DEFAULT_IMAGE_SIZE, HParams

HEAD, CNN, FINE_TUNED = "head", "cnn", "fine-tuned"

MIN_GAIN = 0.01  # a costlier candidate must beat the best so far by more than this held-out figure
PROBE_STEPS = 3  # timed training steps (after one untimed, which traces the step) that estimate a candidate's cost
# A candidate is tried only when this many of its epochs fit in what is left of the budget: what it needs to show its
# worth. The cnn starts from scratch: its recorded trials reached their best after 25 to 32 epochs (bench's
# marked-128 and marked-192, the 10,000-image scale set) and at 100,000 images were still rising after 28. The
# fine-tuned backbone starts from the trained head (10,000 images: 0.976 after 3-4 epochs, against the head's 0.959).
MIN_EPOCHS = {CNN: 25, FINE_TUNED: 5}
FINE_TUNE_EPOCHS = 10  # the fine-tuned candidate's most epochs when --fine-tune-epochs is not given
EVAL_SHARE = 1 / 3  # a held-out image costs about a third of a training one (a forward pass, no gradients)


@dataclasses.dataclass
class Trial:
    """One candidate: what it is, its held-out figure, its best epoch and cost, or why it was not tried."""

    name: str  # HEAD, CNN or FINE_TUNED
    label: str  # what the summary calls it, e.g. "efficientnet_lite0's head"
    figure: Optional[float] = None  # the held-out figure at its kept epoch; None: not tried
    epochs: int = 0  # epochs trained
    kept_epoch: int = 0
    seconds: float = 0.0
    estimated: float = 0.0  # the seconds its MIN_EPOCHS were estimated to take, tried or not (0: not probed)
    note: str = ""  # why not tried, or why it stopped early (at the budget, or it could not catch up)
    # Its held-out figure after each epoch: whether it was still learning where it stopped (cannot_catch_up reads
    # the same figures as they come, in training.TrialStop).
    curve: List[float] = dataclasses.field(default_factory=list)

    def record(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


def applies(hp: HParams, tuned: bool, warm_started: bool, workers: int, held_out: int) -> str:
    """ "" when the Trainer compares candidates, else why not (for the log): --model auto chose a backbone and
    nothing else fixes the model."""
    if not hp.model_choice or hp.model == "cnn":
        return "the model was given, or the size rule chose the cnn"
    if hp.auto_trial_minutes <= 0:
        return "--auto-trial-minutes 0"
    if tuned:
        return "the Tuner searched the backbone's head"
    if warm_started:
        return "warm-started from the last blessed model"
    if workers > 1:
        return "a cluster of machines (each would time its candidates differently)"
    if not held_out:
        return "nothing held out to compare on"
    return ""


def cnn_hparams(hp: HParams) -> HParams:
    """The cnn candidate's settings: the small cnn on the backbone's input, averaged down to about its usual side."""
    return dataclasses.replace(
        hp, model="cnn", fine_tune_epochs=0, cnn_downsample=max(1, round(hp.image_size / DEFAULT_IMAGE_SIZE["cnn"]))
    )


def fine_tuned_hparams(hp: HParams) -> HParams:
    """The fine-tuned candidate's settings: its top layers at a tenth of the head's learning rate (TensorFlow's
    transfer-learning tutorial's rule; at the whole-model 1e-5, ten epochs of a few hundred images moved nothing:
    the shapes set's held-out accuracy stayed at the head's 0.720)."""
    return dataclasses.replace(
        hp,
        fine_tune_epochs=hp.fine_tune_epochs or FINE_TUNE_EPOCHS,
        fine_tune_learning_rate=max(hp.fine_tune_learning_rate, hp.learning_rate / 10),
    )


def head_hparams(hp: HParams) -> HParams:
    return dataclasses.replace(hp, fine_tune_epochs=0)


class Budget:
    """The seconds --auto-trial-minutes gives the candidates after the head, from when the head was trained."""

    def __init__(self, minutes: float, clock=time.monotonic):
        self.clock = clock
        self.deadline = clock() + 60.0 * minutes

    def left(self) -> float:
        return max(0.0, self.deadline - self.clock())


def estimate(step_seconds: float, read_seconds: float, batch: int, train_images: int, held_images: int, epochs: int):
    """Seconds for `epochs` epochs at a measured step time (the training part's steps and the held-out passes), and
    one reading of both parts at the measured seconds a batch (the first epoch's, which fills the cache: without it,
    the cnn at 100,000 images was estimated within its 10 minutes, and took 441 s for 12 epochs)."""
    per_image = step_seconds / max(1, batch)
    reading = read_seconds / max(1, batch) * (train_images + held_images)
    return epochs * per_image * (train_images + EVAL_SHARE * held_images) + reading


def not_tried(epochs: int, estimated: float, left: float) -> str:
    return (
        f"not tried: {epochs} epochs would take ~{estimated / 60:.1f} min at its measured pace, "
        f"{left / 60:.1f} min of --auto-trial-minutes left"
    )


def unbeatable(trials: List[Trial]) -> str:
    """Why no later candidate is tried ("" when one may win): the best so far is within MIN_GAIN of a perfect
    held-out figure, which nothing can beat by more (measured on bench/model_choice_benchmark.py's rare-1: the
    head at 1.000 held-out, the others tried for 250 s to tie it)."""
    best = trials[winner(trials)]
    if best.figure is not None and best.figure + MIN_GAIN > 1.0:
        return f"not tried: {best.label} scores {best.figure:.3f}, which nothing can beat by more than {MIN_GAIN}"
    return ""


def cannot_catch_up(curve: List[float], target: float, epochs_left: int, window: int) -> str:
    """Why a candidate in training should stop ("" to go on): it has come at least half of the way from its first
    epoch's held-out figure to `target` (the best so far and MIN_GAIN), its best figure's pace over the last `window`
    epochs has fallen to half its steepest or less, and carried on at that pace for every epoch left it would still
    not pass `target`. On a learning curve that has bent over, the recent pace is an optimistic bound on the rest
    (the idea of Vizier's decay-curve stopping). A candidate still near its start, or rising as fast as ever, is
    never stopped by it: bench's marked-128 cnn sat at 0.33-0.41 for its first 9 epochs and then reached 1.000.

    Measured on the cnn's trial at 100,000 images (docs/benchmarks.md, "Scale"; 0.922 at best after the 13 epochs its
    10 minutes held at ~44 s an epoch, against the 0.9786 it had to pass): with `window` 5 (--patience) it stops
    after epoch 9 of those 13, or 10 of 14 at ~36 s an epoch."""
    best = list(itertools.accumulate(curve, max))
    if len(best) <= window or best[-1] - best[0] < (target - best[0]) / 2:
        return ""
    paces = [(best[i] - best[i - window]) / window for i in range(window, len(best))]
    recent = paces[-1]
    reach = best[-1] + max(0.0, recent) * epochs_left
    if recent > max(paces) / 2 or reach > target:
        return ""
    return (
        f"stopped after {len(curve)} epochs: at its pace of the last {window} ({recent:+.4f} an epoch) it would reach "
        f"{reach:.3f} in the {epochs_left} epochs left, not the {target:.3f} it had to pass"
    )


def catch_up_target(trials: List[Trial]) -> float:
    """The held-out figure a later candidate must pass to replace the best so far."""
    return trials[winner(trials)].figure + MIN_GAIN


def winner(trials: List[Trial]) -> int:
    """The index of the kept candidate: the first (the head), replaced by a later one only when that beats the best
    so far by more than MIN_GAIN."""
    best = 0
    for i, trial in enumerate(trials[1:], start=1):
        if trial.figure is not None and trial.figure > trials[best].figure + MIN_GAIN:
            best = i
    return best


def describe(trials: List[Trial], kept: int, figure_name: str, held_images: int) -> str:
    """Why the kept model won, in one phrase for the summary, e.g. "compared on 412 held-out train images by
    accuracy: efficientnet_lite0's head 0.871, the cnn 0.995 (kept: better by 0.124), efficientnet_lite0 fine-tuned
    not tried (...)"."""
    parts = []
    for trial in trials:
        if trial.figure is None:
            parts.append(f"{trial.label} {trial.note}")
            continue
        said = f"{trial.label} {trial.figure:.3f}"
        if trial.note:
            said += f" ({trial.note})"
        parts.append(said)
    best = trials[kept]
    if kept == 0:
        why = f"kept {best.label}: no other candidate beat it by more than {MIN_GAIN}"
    else:
        runner_up = max((t for i, t in enumerate(trials) if i != kept and t.figure is not None), key=lambda t: t.figure)
        why = f"kept {best.label}: better than {runner_up.label} by {best.figure - runner_up.figure:.3f}"
    return f"compared on {held_images:,} held-out train images by {figure_name}: {'; '.join(parts)}; {why}"
