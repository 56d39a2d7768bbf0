"""The Trainer's summary, read back for the run summary and the report, from its training.json."""

import json
import os
from typing import Any, Dict

from components.summary_reading import first
from trainer.artifact_files import TRAINING_LOG
from trainer.epochs import kept_epoch, monitor_of


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    model_run = first(c["outputs"], "model_run")
    path = model_run and os.path.join(model_run, TRAINING_LOG)
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        log = json.load(f)
    kept = kept_epoch(log["epochs"], monitor_of(log))
    return {
        "strategy": log["strategy"],
        "epochs": len(log["epochs"]),
        "train_seconds": log["train_seconds"],
        "kept_epoch": kept.get("epoch"),
        "kept_eval_accuracy": kept.get("val_sparse_categorical_accuracy"),
        "kept_balanced_accuracy": kept.get("val_balanced_accuracy"),
        "monitor": monitor_of(log),
        "kept_macro_auc_pr": kept.get("val_auc_pr"),  # multi-label: what training followed
        "class_balance": log.get("class_balance"),
        "warm_started_from": log.get("warm_started_from"),
        "warm_start_skipped": log.get("warm_start_skipped") or "",
        "model_run": model_run,
        "class_names": log["class_names"],
        "tflite": log.get("tflite"),
        "exports": log.get("exports"),
        "still_improving": log.get("still_improving") or [],
        "tuned": log.get("tuned"),
        "model": log["hparams"].get("model"),
        "weights": log["hparams"].get("weights", ""),
        "model_choice": log["hparams"].get("model_choice") or "",
        # what training was measured on (trainer/holdout.py; a log written before: the eval split) and how the model
        # decides (trainer/operating_point.py)
        "held_out": log.get("held_out"),
        "operating_point": log.get("operating_point"),
    }
