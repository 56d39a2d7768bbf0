"""Which epoch of a training phase the model keeps, and whether the phase stopped too soon.

Plain Python over the per-epoch records of training.json: the Trainer (trainer/task.py) and the run
summary (runs/run_summary.py) read training the same way.
"""

from typing import Any, Dict, List

Epoch = Dict[str, Any]
ACCURACY = "val_sparse_categorical_accuracy"  # what training follows on balanced data (trainer/class_balance.py)


def held_out_figure(epoch: Epoch, monitor: str = ACCURACY) -> float:
    """The figure an epoch is kept by (older records without `monitor`: accuracy)."""
    return float(epoch.get(monitor, epoch.get(ACCURACY, 0.0)))


def best_epoch(epochs: List[Epoch], monitor: str = ACCURACY) -> Epoch:
    """The epoch whose weights training keeps: the highest held-out accuracy (trainer/holdout.py; on imbalanced
    data, `monitor` is balanced accuracy), ties to the lower held-out loss.

    The model is judged on accuracy, which often keeps rising while an overconfident model's loss does not
    (measured on bench/shapes.py: loss lowest at epoch 10, accuracy 0.24; at epoch 14, 0.29)."""
    return max(epochs, key=lambda e: (held_out_figure(e, monitor), -e.get("val_loss", float("inf"))))


def kept_epoch(epochs: List[Epoch], monitor: str = ACCURACY) -> Epoch:
    """The epoch whose weights the model has: the Trainer keeps the best epoch of its last training phase."""
    if not epochs:
        return {}
    return best_epoch([e for e in epochs if e.get("phase") == epochs[-1].get("phase")], monitor)


def monitor_of(log: Dict[str, Any]) -> str:
    """The metric a training.json's Trainer followed (older logs: accuracy)."""
    return ((log or {}).get("class_balance") or {}).get("monitor") or ACCURACY


def still_improving(epochs: List[Epoch], cap: int, monitor: str = ACCURACY, patience: int = 5) -> bool:
    """The phase ran to its cap while the figure its epoch is kept by was still rising: its best value, below the
    ceiling, was first reached within the last `patience` epochs. More epochs would likely have helped; a phase
    that only lowered its loss at a figure already flat (or at 1.0) would not have."""
    if not epochs or len(epochs) < cap:
        return False
    values = [held_out_figure(e, monitor) for e in epochs]
    best = max(values)
    return best < 1.0 and values.index(best) >= len(values) - max(1, patience)
