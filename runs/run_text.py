"""A run as text: the summary lines `imagepipe run` prints, a line a component (the hints after them and the
verdicts are runs/verdicts.py's). Everything here reads the dicts run_summary.summarize() returns; nothing reads ML Metadata.

LINES holds, per component kind (run_summary.DETAILS's keys), the text after its state and time.
"""

from typing import Any, Callable, Dict, List

from components import drift as drift_lib
from components.evaluator.results import weakest_class, weakest_label
from components.health import TRUSTED_ACCURACY
from images.finding.listing import split_sort_key
from runs.run_summary import component_kind
from trainer import class_balance, hparams, operating_point


def format_summary(summary: Dict[str, Any]) -> List[str]:
    lines = [f"run {summary['run_id']}"]
    width = max((len(c["component"]) for c in summary["components"]), default=0)
    for c in summary["components"]:
        lines.append(f"  {c['component']:<{width}} {c['state']:<7} {c['seconds']:>6.1f} s  {one_line(c)}".rstrip())
    return lines


def one_line(c: Dict[str, Any]) -> str:
    kind = component_kind(c["component"])
    if c.get("missing"):
        return f"its outputs are no longer on disk ({c['missing'][0]})"
    if kind in ("DataValidationGate", "DataHealthGate") and c["state"] == "FAILED":
        return "stopped the run: " + (c["error"].splitlines()[0][:200] if c["error"] else "anomalies or drift found")
    if kind in LINES and c["details"] and not (c["state"] == "FAILED" and c["error"]):
        return LINES[kind](c)
    if c["state"] == "FAILED" and c["error"]:
        return c["error"].splitlines()[0][:200]
    return ""


def _ingestion(c: Dict[str, Any]) -> str:
    d = c["details"]
    splits = ", ".join(
        f"{s} {n:,}" for s, n in sorted(d["examples_per_split"].items(), key=lambda kv: split_sort_key(kv[0]))
    )
    reasons = ", ".join(f"{r} {n}" for r, n in d["quarantine_reasons"].items())
    text = (
        f"{d['files_seen']:,} files -> {d['examples_written']:,} examples ({splits}), "
        f"{d['quarantined']:,} quarantined" + (f" ({reasons})" if reasons else "") + f", {len(d['label_map'])} classes"
    )
    if d.get("imbalance_ratio") is not None:
        text += f" ({describe_balance(d)})"
    if d.get("split_notes"):
        text += "; " + "; ".join(d["split_notes"])
    if d.get("duplicate_groups"):
        text += f", {d['duplicate_files']} files in {d['duplicate_groups']} duplicate groups"
    if d.get("downscaled"):
        text += f", {d['downscaled']:,} stored downscaled (above {d['store_max_pixels']:,} pixels)"
    if d.get("near_duplicate_groups"):
        text += f", {describe_near_duplicates(d)}"
    if d.get("review"):
        text += f"; {describe_review(d['review'])}"
    return text


def describe_review(review: Dict[str, Any]) -> str:
    """What a review file changed, in a phrase (the report and the card say the same)."""
    text = f"review {review['file']}: {review['relabelled']:,} relabelled, {review['excluded']:,} excluded"
    if review["not_applied"]:
        whys = sorted({row["why"] for row in review["not_applied"]})
        text += f", {len(review['not_applied']):,} not applied ({'; '.join(whys)})"
    return text


def describe_balance(d: Dict[str, Any]) -> str:
    """The train split's class mix in a phrase: its imbalance ratio, and when imbalanced the classes' counts."""
    ratio = d["imbalance_ratio"]
    train = (d.get("examples_per_split_and_class") or {}).get("train", {})
    if ratio <= class_balance.IMBALANCED_RATIO:
        return f"balanced: largest/smallest {ratio:.1f}:1 in train"
    return f"imbalanced {ratio:.1f}:1 in train: {class_balance.describe_mix(train)}"


def describe_near_duplicates(d: Dict[str, Any]) -> str:
    """Ingestion's near-duplicates in a phrase: groups, eval examples with a copy in train, conflicts."""
    text = f"{d['near_duplicate_files']:,} files in {d['near_duplicate_groups']:,} near-duplicate groups"
    if d["near_duplicate_eval_leaks"]:
        text += (
            f" ({d['near_duplicate_eval_leaks']:,} eval examples, {d['near_duplicate_eval_leak_fraction']:.1%},"
            " have one in train)"
        )
    if d["near_duplicate_conflicts"]:
        text += f", {d['near_duplicate_conflicts']:,} with conflicting labels"
    if d.get("near_duplicates_dropped"):
        text += f", {d['near_duplicates_dropped']:,} copies dropped"
    return text


def describe_label_model(accuracy: float, method: str = "") -> str:
    """The label check's model in a phrase, with a warning when it is too weak to rank labels well: on the cnn's
    pixels, a pretrained backbone's features do better; on those features already, more images or cleaner labels
    are what helps."""
    text = f"its model's out-of-sample accuracy {accuracy:.2f}"
    if accuracy < TRUSTED_ACCURACY:
        text += " is too low for a reliable ranking: " + (
            "the classes are hard to tell apart on these features, so its suspects are weak hints"
            if "backbone features" in method
            else "a pretrained backbone's features do better (--model efficientnet_lite0)"
        )
    return text


def _health(c: Dict[str, Any]) -> str:
    d = c["details"]
    if d.get("label_issue_fraction") is not None:
        text = (
            f"{d['label_issues']:,} likely label errors of {d['examples']:,} examples"
            if not d.get("label_check_sampled")
            else f"{d['label_issues']:,} likely label errors in a sample of "
            f"{d['label_check_sampled']:,} of {d['examples']:,} examples ({d['label_issue_fraction']:.1%} estimated)"
        )
        if d.get("label_check_accuracy") is not None:
            text += f" ({describe_label_model(d['label_check_accuracy'], d.get('label_check_method', ''))})"
    else:
        text = "labels not checked" + (
            f" ({d['label_check_skipped']})"
            if d.get("label_check_skipped")
            else " (--label-check on, or a transfer model)"
        )
    text += f", {d['outliers']:,} outliers or poor images"
    if d.get("feature_drift") is not None:
        text += f", feature drift {d['feature_drift']:.3f}"
    if d.get("problems"):
        text += ": " + "; ".join(p["text"] for p in d["problems"])
    if d.get("warnings"):
        text += "; warning: " + "; ".join(w["text"] for w in d["warnings"])
    return text


def _features(c: Dict[str, Any]) -> str:
    d = c["details"]
    views = d["views"].get("train", 0)
    return (
        f"{d['images']:,} images: {d['reused']:,} features reused from the cache, {d['computed']:,} computed"
        f" ({d['dim']:,} values each" + (f"; {views} augmented views a training image" if views else "") + ")"
    )


def _gate(c: Dict[str, Any]) -> str:
    d = c["details"]
    drift = d["drift"]
    classes = drift_lib.describe_classes(drift) or ""
    if d["passed"]:
        compared = (
            "no drift from the last blessed model's data"
            if "checks" in drift
            else f"drift not checked: {drift['skipped']}"
        )
        return f"passed: no anomalies, {compared}" + (f"; {classes}" if classes else "")
    problems = [f"[{a['split']}] {a['feature']}: {a['short']}" for a in d["anomalies"]]
    problems += [f"[drift] {drift_lib.describe_check(check)}" for check in d["drifted"]]
    return (
        f"{len(d['anomalies'])} anomalies, {len(d['drifted'])} drifted (warn only): "
        + "; ".join(problems)
        + (f"; {classes}" if classes else "")
    )


def _trainer(c: Dict[str, Any]) -> str:
    d = c["details"]
    accuracy = d["kept_eval_accuracy"]
    balanced = d.get("monitor") == class_balance.BALANCED_ACCURACY and d.get("kept_balanced_accuracy") is not None
    multi = d.get("monitor") == class_balance.MACRO_AUC_PR and d.get("kept_macro_auc_pr") is not None
    split = validated_on(d)
    return (
        describe_model(d)
        + f"{d['epochs']} epochs on {d['strategy']}"
        + (
            f", kept epoch {d['kept_epoch']} (best {split} macro AUC-PR): {d['kept_macro_auc_pr']:.4f}"
            if multi
            else f", kept epoch {d['kept_epoch']} (best {split} balanced accuracy): balanced accuracy "
            f"{d['kept_balanced_accuracy']:.4f}, {split} accuracy {accuracy:.4f}"
            if balanced and accuracy is not None
            else f", kept epoch {d['kept_epoch']} (best {split} accuracy): {split} accuracy {accuracy:.4f}"
            if accuracy is not None
            else ""
        )
        + (
            f"; {describe_class_balance(d['class_balance'])}"
            if (d.get("class_balance") or {}).get("imbalanced")
            else ""
        )
        + (f"; {operating_point.describe(d['operating_point'])}" if d.get("operating_point") else "")
        + (", with the search's values" if d.get("tuned") else "")
        + (", warm-started" if d.get("warm_started_from") else "")
        + (f", not warm-started: {d['warm_start_skipped']}" if d.get("warm_start_skipped") else "")
        + (f"; {still_improving(d['still_improving'])}" if d.get("still_improving") else "")
        + (f"; {describe_tflite(d['tflite'])}" if d.get("tflite") else "")
        + (f"; {describe_exports(d['exports'])}" if d.get("exports") else "")
    )


def validated_on(d: Dict[str, Any]) -> str:
    """What a training run's figures were measured on: its held-out train images (trainer/holdout.py), or for a run
    made before them, the eval split."""
    held = d.get("held_out")
    if not held:
        return "eval"
    return "held-out" if held.get("held_out_examples") else "training"


def describe_model(d: Dict[str, Any]) -> str:
    """The model trained, and why when --model auto chose it: 'efficientnet_lite0, pretrained ... (--model auto: ...), '."""
    if not d.get("model"):
        return ""  # a training log written before the model was recorded here
    return hparams.describe_model(d["model"], d.get("weights", ""), d.get("model_choice") or "") + ", "


def describe_class_balance(balancing: Dict[str, Any]) -> str:
    """What training did about imbalanced classes, in a phrase."""
    if balancing.get("task") == "multi":
        how = {"weights": "rare labels' positives weighted in the loss", "off": "no weighting (--class-balance off)"}[
            balancing["mode"]
        ]
        ratio = balancing.get("imbalance_ratio")  # None with a single label
        return how + (f" (labels {ratio:.1f}:1)" if ratio is not None else "")
    how = {
        "weights": "loss weighted by class",
        "sampling": "class-balanced batches",
        "off": "no balancing (--class-balance off)",
    }[balancing["mode"]]
    return f"{how} (imbalanced {balancing['imbalance_ratio']:.1f}:1)"


def describe_values(values: Dict[str, Any]) -> str:
    """A search's values in a phrase: learning_rate 0.0021, dropout 0.3, ..."""
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in (values or {}).items())


def _tuner(c: Dict[str, Any]) -> str:
    d = c["details"]
    score = f" ({objective_name(d)} {d['best_score']:.4f})" if d.get("best_score") is not None else ""
    if d["searched"]:
        return f"searched {len(d['results'])} trials ({d['reason']}): best {describe_values(d['best'])}{score}"
    return (
        f"reused the search of {d['searched_at']} ({d['reason']}): {describe_values(d['best'])}{score}; "
        "--retune to search again"
    )


def objective_name(d: Dict[str, Any]) -> str:
    """What a search's trials were scored on: held-out accuracy, or balanced accuracy on imbalanced classes
    (multi-label: macro AUC-PR), all on the held-out part of the train split (trainer/holdout.py)."""
    return "held-out " + class_balance.figure_name(d.get("objective"))


def still_improving(options: List[str]) -> str:
    """The hint when the epoch cap, not early stopping, ended training that was still improving."""
    return f"still improving at the last epoch: raise {' and '.join(options)}"


def describe_labels(d: Dict[str, Any], most: int = 6) -> str:
    """A multi-label evaluation in a phrase: macro AUC-PR and F1, each label's F1 at its threshold, weakest first."""
    text = f"macro AUC-PR {d['macro_auc_pr']:.4f}" if d.get("macro_auc_pr") is not None else "macro AUC-PR -"
    if d.get("macro_f1") is not None:
        text += f", macro F1 {d['macro_f1']:.4f} at the labels' thresholds"
    text += f" on {d.get('example_count') or 0:,} eval examples"
    if d.get("baseline_macro_auc_pr") is not None:
        text += f" (last blessed model: macro AUC-PR {d['baseline_macro_auc_pr']:.4f})"
    rows = sorted(
        ((name, m["f1"], m["threshold"]) for name, m in (d.get("per_class") or {}).items() if m.get("f1") is not None),
        key=lambda r: (r[1], r[0]),
    )
    if rows:
        text += "; F1 " + ", ".join(f"{name} {f1:.2f} (>{t:g})" for name, f1, t in rows[:most])
        text += f" and {len(rows) - most} more labels" if len(rows) > most else ""
    weakest = weakest_label(d)
    if weakest:
        text += f"; weakest label {weakest['name']!r} ({weakest['support']:,} eval images)"
    return text


def describe_explanations(d: Dict[str, Any]) -> str:
    """'; N eval images explained in S s' (what the explanations cost), or ''."""
    found = d.get("explanations") or {}
    if not found.get("images"):
        return ""
    return f"; {len(found['images'])} eval images explained in {found['seconds']:.1f} s"


def _evaluator(c: Dict[str, Any]) -> str:
    d = c["details"]
    if d.get("task") == "multi":
        text = describe_labels(d)
        if d.get("baseline_skipped"):
            text += f" (not compared: {d['baseline_skipped']}; judged on the threshold alone)"
        return (
            text
            + (", BLESSED" if d["blessed"] else ", not blessed: " + "; ".join(d["failures"])[:300])
            + describe_explanations(d)
        )
    text = f"accuracy {d['accuracy']:.4f}" if d["accuracy"] is not None else ""
    if d.get("balanced_accuracy") is not None:
        text += f", balanced accuracy {d['balanced_accuracy']:.4f}"
    if d["accuracy"] is not None:
        text += f" on {d['example_count']:,} eval examples"
    compared_on = ((d.get("gate") or {}).get("compared_on")) or "accuracy"
    baseline = d.get(f"baseline_{compared_on}")
    if baseline is not None:
        text += f" (last blessed model: {compared_on.replace('_', ' ')} {baseline:.4f})"
    if d.get("baseline_skipped"):
        text += f" (not compared: {d['baseline_skipped']}; judged on the threshold alone)"
    if d.get("per_class"):
        text += f"; {describe_recalls(d)}"
    return (
        text
        + (", BLESSED" if d["blessed"] else ", not blessed: " + "; ".join(d["failures"])[:300])
        + describe_explanations(d)
    )


def describe_recalls(d: Dict[str, Any], most: int = 6) -> str:
    """Each class's recall (the weakest first), or with many classes the weakest few, naming the weakest."""
    rows = sorted(
        ((name, m["recall"]) for name, m in d["per_class"].items() if m.get("recall") is not None),
        key=lambda kv: (kv[1], kv[0]),
    )
    unseen = sorted(name for name, m in d["per_class"].items() if m.get("recall") is None)  # no eval image
    if not rows:
        return ""
    shown = ", ".join(f"{name} {recall:.2f}" for name, recall in rows[:most])
    text = f"recall {shown}" + (f" and {len(rows) - most} more classes" if len(rows) > most else "")
    if unseen:
        text += (
            "; no eval images of "
            + ", ".join(unseen[:most])
            + (f" and {len(unseen) - most} more" if len(unseen) > most else "")
        )
    weakest = weakest_class(d)
    if weakest:
        text += (
            f"; weakest class {weakest['name']!r} ({weakest['support']:,} eval images"
            + ("" if weakest["judged"] else ", too few to judge")
            + ")"
        )
    return text


def describe_card(d: Dict[str, Any]) -> str:
    """The model card in a phrase: where it is, the threshold that goes with the model, the test split."""
    evaluation = d["card"]["evaluation"]
    if evaluation.get("task") == "multi":
        thresholds = evaluation.get("label_thresholds") or {}
        text = f"{d['card_md']}; label thresholds " + ", ".join(f"{n} {t:g}" for n, t in thresholds.items())
        test = evaluation.get("test") or {}
        if test.get("macro_auc_pr") is not None:
            text += f"; test split macro AUC-PR {test['macro_auc_pr']:.4f} on {test['examples'] or 0:,} examples"
        return text
    chosen = evaluation.get("confidence_threshold") or {}
    text = f"{d['card_md']}; confidence threshold {chosen.get('threshold', 0):g}"
    at = evaluation.get("at_threshold") or {}
    if chosen.get("threshold") and at and at.get("precision") is not None:  # None: no image reaches it
        text += f" (precision {at['precision']:.3f}, coverage {at['coverage']:.3f})"
    test = evaluation.get("test") or {}
    if test.get("accuracy") is not None:
        text += f"; test split accuracy {test['accuracy']:.4f} on {test['examples'] or 0:,} examples"
    return text


def describe_exports(record: Dict[str, Any]) -> str:
    """ONNX and Core ML in a phrase: each one's size and agreement with the SavedModel, or why it was not made."""
    parts = []
    for kind, export in record.items():
        if export.get("error"):
            parts.append(f"{kind} failed: {export['error']}")
        elif kind == "onnx":
            parts.append(
                f"ONNX {export['bytes'] / 2**20:.1f} MB"
                + (
                    f", {export.get('agreement_on', 'top-1')} as the SavedModel on {export['agreement']:.1%} of "
                    f"{export['examples']:,} {export.get('scored_on', 'eval')} images"
                    if export.get("agreement") is not None
                    else ""
                )
            )
        else:
            parts.append(f"Core ML {export['bytes'] / 2**20:.1f} MB (spec checked)")
    return ", ".join(parts)


def describe_tflite(record: Dict[str, Any]) -> str:
    """The Trainer's TFLite exports in a phrase: each one's held-out accuracy next to the SavedModel's."""
    if "error" in record:
        return f"TFLite export failed: {record['error']}"
    models = ", ".join(
        f"{kind} {m['accuracy']:.4f} ({m['bytes'] / 1024:,.0f} KB)" for kind, m in record["models"].items()
    )
    return (
        f"TFLite {models} vs SavedModel {record['savedmodel_accuracy']:.4f} on {record['examples']:,} "
        f"{record.get('scored_on', 'eval')} examples"
    )


LINES: Dict[str, Callable[[Dict[str, Any]], str]] = {
    "ImageExampleGen": _ingestion,
    "DataValidationGate": _gate,
    "ExampleValidator": lambda c: f"{len(c['details']['anomalies'])} anomalies",
    "Transform": lambda c: f"{c['details']['transformed_megabytes']:.1f} MB of resized uint8 pixels",
    "BackboneFeatures": _features,
    "DataHealthGate": lambda c: "passed" if c["details"]["passed"] else "over the limits (warn only)",
    "DataHealth": _health,
    "Tuner": _tuner,
    "Trainer": _trainer,
    "Evaluator": _evaluator,
    "ModelCard": lambda c: describe_card(c["details"]),
    "Pusher": lambda c: (
        f"pushed to {c['details']['destination']}" if c["details"]["pushed"] else "not pushed (model not blessed)"
    ),
    "SchemaGen": lambda c: c["details"]["schema"],
    "ImportSchemaGen": lambda c: c["details"]["schema"],
}
