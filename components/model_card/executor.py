"""ModelCard's executor: the card of the run's model, read from its input artifacts (ML Metadata tracks each
one: the model, its training log, the evaluation and blessing, the examples and ingestion report, the data
health report, the last blessed model) and the execution's own context (pipeline, run). No figure is
typed in: every number comes from a file one of those artifacts holds. See components/model_card/__init__.py
for the schema of model_card.json.
"""

import datetime
import json
import os
import platform
from typing import Any, Dict, List, Optional

import keras
import tensorflow as tf
import tfx
from absl import logging
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import io_utils

import stacks
from components.evaluator import results as evaluation_results
from components.example_gen import SUMMARY_FILE as INGESTION_SUMMARY
from components.health import HEALTH_FILE
from components.model_card import CARD_HTML, CARD_JSON, CARD_MD, SCHEMA_VERSION, THRESHOLD_FILE, TO_FILL_IN, render
from trainer.artifact_files import INFO_FILE, KERAS_DIR, TRAINING_LOG
from trainer.epochs import kept_epoch, monitor_of
from trainer.hparams import describe_model

OUTPUT = "model_card"


def _json(path: str) -> Optional[Dict[str, Any]]:
    return json.loads(io_utils.read_string_file(path)) if fileio.exists(path) else None


def _one(input_dict, key: str) -> Optional[types.Artifact]:
    artifacts = input_dict.get(key) or []
    return artifacts[0] if artifacts else None


def blessing_reason(blessed: bool, found: Dict[str, Any], threshold: Optional[float], skipped: str) -> str:
    """Why the model was blessed or not, in a sentence, from the evaluation's figures and validation."""
    gate = found.get("gate") or {}
    if not blessed:
        return "not blessed: " + ("; ".join(found.get("failures") or []) or "its validation failed")
    # A multi-label model is blessed on macro AUC-PR (--accuracy-threshold's bound), each label at its threshold.
    multi = found.get("task") == "multi"
    measure, bound = ("macro_auc_pr", gate.get("min_macro_auc_pr")) if multi else ("accuracy", threshold)
    parts = []
    if found.get(measure) is not None and bound is not None:
        parts.append(f"eval {_shown(measure)} {found[measure]:.4f} reached the threshold {bound:.4f}")
    if gate.get("judged"):
        parts.append(
            f"each of the {len(gate['judged'])} {'labels' if multi else 'classes'} with at least "
            f"{gate['min_eval_examples']} eval images reached recall {gate['min_class_recall']:.2f}"
            + (" at its threshold" if multi else "")
        )
    compared_on = measure if multi else gate.get("compared_on") or "accuracy"
    value, baseline = found.get(compared_on), found.get(f"baseline_{compared_on}")
    if baseline is not None and value is not None:
        parts.append(f"{_shown(compared_on)} {value:.4f} not below the last blessed model's {baseline:.4f}")
    elif skipped:
        parts.append(f"not compared with the last blessed model ({skipped})")
    else:
        parts.append("no blessed model to compare with yet")
    return "blessed: " + "; ".join(parts)


def _shown(metric: str) -> str:
    return "macro AUC-PR" if metric == "macro_auc_pr" else metric.replace("_", " ")


def _split_scores(found: Dict[str, Any], views: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if found.get("task") == "multi":  # each label at its own threshold
        return {
            "examples": found.get("example_count"),
            "macro_auc_pr": found.get("macro_auc_pr"),
            "macro_f1": found.get("macro_f1"),
            "macro_precision": found.get("macro_precision"),
            "macro_recall": found.get("macro_recall"),
            "accuracy": None,
            "balanced_accuracy": None,
            "weakest_label": evaluation_results.weakest_label(found),
            "per_class": found.get("per_class") or {},
            "at_threshold": None,
        }
    at = (views or {}).get("at_threshold") or {}
    return {
        "examples": found.get("example_count"),
        "accuracy": found.get("accuracy"),
        "balanced_accuracy": found.get("balanced_accuracy"),
        "weakest_class": evaluation_results.weakest_class(found) if found.get("gate") else None,
        "per_class": {
            name: {k: m.get(k) for k in ("precision", "recall", "f1", "support")}
            for name, m in (at.get("per_class") or {}).items()
        },
        "at_threshold": {k: at.get(k) for k in ("precision", "recall", "coverage")} if at else None,
    }


def build_card(input_dict: Dict[str, List[types.Artifact]], pipeline: str, run: Optional[str]) -> Dict[str, Any]:
    """The card's dict, from the component's inputs (the model, its Trainer's run, the evaluation and blessing,
    the examples and their ingestion report, data health, the baseline) and the run's names."""
    blessing = artifact_utils.get_single_instance(input_dict["blessing"])
    blessed = blessing.has_custom_property("blessed") and bool(blessing.get_int_custom_property("blessed"))
    skipped = (
        blessing.get_string_custom_property("baseline_skipped")
        if blessing.has_custom_property("baseline_skipped")
        else ""
    )
    model_uri = artifact_utils.get_single_uri(input_dict["model"])
    examples = artifact_utils.get_single_instance(input_dict["examples"])
    health_artifact, baseline = _one(input_dict, "health"), _one(input_dict, "baseline_model")
    info = _json(os.path.join(model_uri, KERAS_DIR, INFO_FILE)) or {}
    log = _json(os.path.join(artifact_utils.get_single_uri(input_dict["model_run"]), TRAINING_LOG)) or {}
    ingest = _json(os.path.join(artifact_utils.get_single_uri(input_dict["ingestion_report"]), INGESTION_SUMMARY)) or {}
    health = _json(os.path.join(health_artifact.uri, HEALTH_FILE)) if health_artifact else None
    span = examples.get_int_custom_property("span") if examples.has_custom_property("span") else None
    if span is None and examples.has_property("span"):
        span = examples.span
    return {
        "schema_version": SCHEMA_VERSION,
        "model": _model(model_uri, info, log, pipeline),
        "data": _data(ingest, health, span),
        "training": _training(log, pipeline, run, span, baseline),
        "evaluation": _evaluation(artifact_utils.get_single_uri(input_dict["evaluation"]), blessed, skipped, baseline),
        "exports": render.export_rows(log),
        "to_fill_in": dict(TO_FILL_IN_SECTIONS),
    }


def _model(model_uri: str, info: Dict[str, Any], log: Dict[str, Any], pipeline: str) -> Dict[str, Any]:
    hparams = log.get("hparams") or {}
    return {
        "name": pipeline,
        "architecture": info.get("model") or hparams.get("model"),
        # the weights it started from, and why --model auto chose it
        "architecture_detail": describe_model(
            info.get("model") or hparams.get("model") or "",
            hparams.get("weights", ""),
            hparams.get("model_choice") or "",
        ),
        "image_size": info.get("image_size") or hparams.get("image_size"),
        "classes": info.get("class_names") or log.get("class_names") or [],
        # multi: any number of the classes (labels) an image, each with its own probability and threshold
        "task": info.get("task") or "single",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # the stack that trained it (stacks/): which lock, and the versions that matter for serving it
        "framework": {
            "stack": stacks.NAME,
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "tfx": tfx.__version__,
            "keras": keras.__version__,
        },
        "artifact": model_uri,
        "signature": "serving_default: image_bytes [batch] encoded JPEG/PNG/GIF/BMP -> probabilities, "
        "class_names, predicted_class, predicted_probability",
    }


def _data(ingest: Dict[str, Any], health: Optional[Dict[str, Any]], span: Optional[int]) -> Dict[str, Any]:
    return {
        "sources": [ingest.get("source")] if ingest.get("source") else [],
        "layout": ingest.get("layout"),
        "span": span,
        "files_seen": ingest.get("files_seen"),
        "examples": ingest.get("examples_written"),
        "per_split": ingest.get("examples_per_split"),
        "per_class_and_split": ingest.get("examples_per_split_and_class"),
        "examples_without_labels": ingest.get("examples_without_labels"),  # multi-label: images no label fits
        "imbalance_ratio": ingest.get("imbalance_ratio"),
        "classes_with_few_eval_examples": ingest.get("classes_with_few_eval_examples"),
        "quarantined": ingest.get("quarantined"),
        "quarantine_reasons": ingest.get("quarantine_reasons"),
        "duplicate_files": ingest.get("duplicate_files"),
        "near_duplicate_groups": ingest.get("near_duplicate_groups"),
        "review": (
            {k: ingest["review"][k] for k in ("file", "relabelled", "excluded")}
            | {"not_applied": len(ingest["review"]["not_applied"])}
        )
        if ingest.get("review")
        else None,
        "eval_with_near_duplicate_in_train": ingest.get("near_duplicate_eval_leak_fraction"),
        "likely_label_errors": (health or {}).get("label_issues")
        if (health or {}).get("label_issue_fraction") is not None
        else None,
    }


def _training(
    log: Dict[str, Any], pipeline: str, run: Optional[str], span: Optional[int], baseline: Optional[types.Artifact]
) -> Dict[str, Any]:
    hparams = log.get("hparams") or {}
    epochs = log.get("epochs") or []
    kept = kept_epoch(epochs, monitor_of(log))  # the weights it has
    return {
        "settings": hparams,
        "tuned": log.get("tuned"),
        "epochs": len(epochs),
        "kept_epoch": kept.get("epoch") if kept else None,
        "device": log.get("strategy"),
        "seconds": log.get("train_seconds"),
        "warm_started_from": log.get("warm_started_from"),
        "class_balance": {
            k: (log.get("class_balance") or {}).get(k)
            for k in ("mode", "imbalance_ratio", "monitor", "task", "positive_weights")
        }
        if log.get("class_balance")
        else None,
        "lineage": {
            "pipeline": pipeline,
            "run": run,
            "span": span,
            "base_model": {"artifact": baseline.uri, "id": baseline.id} if baseline else None,
        },
    }


def _evaluation(
    evaluation_uri: str, blessed: bool, baseline_skipped: str, baseline: Optional[types.Artifact]
) -> Dict[str, Any]:
    found = evaluation_results.metrics(evaluation_uri)
    views = evaluation_results.views(evaluation_uri)
    test = evaluation_results.test_split(evaluation_uri)
    chosen = (views or {}).get("chosen")
    return {
        "split": "eval",
        **_split_scores(found, views),
        "task": "multi" if found.get("task") == "multi" else "single",
        # single-label: one threshold; multi-label: a threshold per label (the labels' own)
        "confidence_threshold": chosen if found.get("task") != "multi" else None,
        "label_thresholds": (chosen or {}).get("thresholds") if found.get("task") == "multi" else None,
        "label_thresholds_how": (chosen or {}).get("how") if found.get("task") == "multi" else None,
        "class_gate": {
            "min_class_recall": found["gate"]["min_class_recall"],
            "min_eval_examples": found["gate"]["min_eval_examples"],
            "judged": [found["gate"]["class_names"][i] for i in found["gate"]["judged"]],
            "must_find": [found["gate"]["class_names"][i] for i in found["gate"].get("must_find", [])],
            "compared_on": found["gate"]["compared_on"],
            **({"min_macro_auc_pr": found["gate"].get("min_macro_auc_pr")} if found.get("task") == "multi" else {}),
        }
        if found.get("gate")
        else None,
        "blessed": blessed,
        "blessing_reason": blessing_reason(
            blessed, found, evaluation_results.accuracy_threshold(evaluation_uri), baseline_skipped
        ),
        "last_blessed": {
            "accuracy": found.get("baseline_accuracy"),
            "balanced_accuracy": found.get("baseline_balanced_accuracy"),
            **(
                {"macro_auc_pr": found["baseline_macro_auc_pr"]}
                if found.get("baseline_macro_auc_pr") is not None
                else {}
            ),
            "artifact": baseline.uri,
        }
        if baseline and (found.get("baseline_accuracy") is not None or found.get("baseline_macro_auc_pr") is not None)
        else None,
        "test": _split_scores(test, test.get("views")) if test else None,
    }


# What the pipeline cannot know: the team writes it into the card.
TO_FILL_IN_SECTIONS = {
    "intended_use": f"{TO_FILL_IN}: who uses the model, for what, and what it must not be used for",
    "limitations": f"{TO_FILL_IN}: where it fails (kinds of images, classes, conditions) and what the "
    "eval split does not cover",
    "ethical_considerations": f"{TO_FILL_IN}: people in the images, consent, harms of a wrong answer",
    "contact": f"{TO_FILL_IN}: who owns the model and answers questions about it",
}


class Executor(base_executor.BaseExecutor):
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        card = build_card(input_dict, exec_properties["pipeline"], self._context.pipeline_run_id)
        out = artifact_utils.get_single_uri(output_dict[OUTPUT])
        io_utils.write_string_file(os.path.join(out, CARD_JSON), json.dumps(card, indent=1))
        io_utils.write_string_file(os.path.join(out, CARD_MD), render.markdown(card))
        io_utils.write_string_file(os.path.join(out, CARD_HTML), render.html(card))
        threshold = card["evaluation"]["confidence_threshold"] or {"threshold": 0.0, "how": "none"}
        if card["evaluation"]["task"] == "multi":  # what predict reads: each label's threshold
            threshold = {
                "task": "multi",
                "thresholds": card["evaluation"]["label_thresholds"],
                "how": card["evaluation"]["label_thresholds_how"],
            }
        io_utils.write_string_file(os.path.join(out, THRESHOLD_FILE), json.dumps(threshold))
        logging.info("ModelCard: %s (%s)", out, card["evaluation"]["blessing_reason"])
