"""Which epoch of a training phase the model keeps, and whether the phase stopped too soon.

Plain Python over the per-epoch records of training.json: the Trainer (trainer/task.py) and the run
summary (runs/run_summary.py) read training the same way.
"""

from typing import Any, Dict, List

Epoch = Dict[str, Any]
ACCURACY = "val_sparse_categorical_accuracy"  # what training follows on balanced data (trainer/class_balance.py)


def best_epoch(epochs: List[Epoch], monitor: str = ACCURACY) -> Epoch:
    """The epoch whose weights training keeps: the highest eval accuracy (on imbalanced data, `monitor` is
    balanced accuracy), ties to the lower eval loss.

    Early stopping on balanced data watches the eval loss (it stops after --patience epochs without a lower
    one), but the model is judged on accuracy, which often keeps rising while an overconfident model's loss
    does not (measured on bench/shapes.py: eval loss lowest at epoch 10, accuracy 0.24; at epoch 14, 0.29)."""
    return max(epochs, key=lambda e: (e.get(monitor, e.get(ACCURACY, 0.0)), -e.get("val_loss", float("inf"))))


def kept_epoch(epochs: List[Epoch], monitor: str = ACCURACY) -> Epoch:
    """The epoch whose weights the model has: the Trainer keeps the best epoch of its last training phase."""
    if not epochs:
        return {}
    return best_epoch([e for e in epochs if e.get("phase") == epochs[-1].get("phase")], monitor)


def monitor_of(log: Dict[str, Any]) -> str:
    """The metric a training.json's Trainer followed (older logs: accuracy)."""
    return ((log or {}).get("class_balance") or {}).get("monitor") or ACCURACY


def still_improving(epochs: List[Epoch], cap: int, monitor: str = ACCURACY) -> bool:
    """The phase ran to its cap with its best eval loss or accuracy at the last epoch: the cap, not
    early stopping, ended it, and more epochs would likely have helped."""
    if not epochs or len(epochs) < cap:
        return False
    last = epochs[-1]
    return last is min(epochs, key=lambda e: e.get("val_loss", float("inf"))) or last is best_epoch(epochs, monitor)
