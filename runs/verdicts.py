"""What a run's outcome means, for the end of `imagepipe run` and the report's header: the data verdict, the model
verdict (never on one number: the weakest class or label is named), and the next steps."""

from typing import Any, Dict, List, Optional, Tuple

from components.evaluator.results import weakest_class
from runs.run_summary import component_kind
from runs.run_text import describe_labels


def by_kind(summary: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The run's components by kind (the first of each), for the hints and verdicts below."""
    found: Dict[str, Dict[str, Any]] = {}
    for c in summary["components"]:
        found.setdefault(component_kind(c["component"]) or c["component"], c)
    return found


def hints(
    summary: Dict[str, Any], predict_command: Optional[str] = None, review_command: Optional[str] = None
) -> List[str]:
    """What to look at next, after the summary lines: the quarantine list, the data health findings and the page
    that reviews them, TensorBoard, and (when a model was pushed) the command that classifies images with it."""
    details = {kind: c["details"] for kind, c in by_kind(summary).items()}
    out = []
    if details.get("ImageExampleGen", {}).get("quarantined"):
        out.append(f"quarantined files, with reasons: {details['ImageExampleGen']['quarantine_csv']}")
    if details.get("ImageExampleGen", {}).get("near_duplicate_groups") and details["ImageExampleGen"].get(
        "near_duplicates_csv"
    ):  # a failed ingestion keeps no list of them
        out.append(f"near-duplicate groups: {details['ImageExampleGen']['near_duplicates_csv']}")
    for key, what in (("label_issues", "likely label errors, most likely first"), ("outliers", "outliers")):
        if details.get("DataHealth", {}).get(key):
            out.append(f"{what}: {details['DataHealth'][key + '_csv']}")
    if review_command and (
        details.get("DataHealth", {}).get("label_issues") or details.get("DataHealth", {}).get("outliers")
    ):
        out.append(f"keep, relabel or exclude them on a page, for the next run's --review: {review_command}")
    if details.get("Trainer", {}).get("model_run"):
        out.append(f"training curves: tensorboard --logdir {details['Trainer']['model_run']}")
    if details.get("ModelCard", {}).get("card_html"):
        out.append(f"model card: {details['ModelCard']['card_html']}")
    if details.get("Pusher", {}).get("pushed") and predict_command:
        out.append(f"classify images with the pushed model: {predict_command}")
    return out


def data_verdict(summary: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(ok | warn | bad, text) about the data: ingestion's counts and the validation gate's verdict."""
    components = by_kind(summary)
    ingest = components.get("ImageExampleGen", {}).get("details") or {}
    if not ingest:
        return None
    gate = components.get("DataValidationGate", {})
    anomalies = (gate.get("details") or {}).get("anomalies")
    drifted = (gate.get("details") or {}).get("drifted")
    gate_failed = gate.get("state") == "FAILED"
    health_failed = components.get("DataHealthGate", {}).get("state") == "FAILED"
    health_problems = (components.get("DataHealth", {}).get("details") or {}).get("problems")
    warned = [f"{len(anomalies)} anomalies"] if anomalies else []
    warned += [f"drift in {len(drifted)} distributions"] if drifted else []
    warned += [f"data health: {', '.join(p['check'] for p in health_problems)}"] if health_problems else []
    kind = "bad" if gate_failed or health_failed else "warn" if ingest["quarantined"] or warned else "ok"
    text = (
        f"{ingest['files_seen']:,} files → {ingest['examples_written']:,} examples, "
        f"{ingest['quarantined']:,} quarantined; "
        + (
            "validation stopped the run"
            if gate_failed
            else "the data health check stopped the run"
            if health_failed
            else f"{' and '.join(warned)} (warned)"
            if warned
            else "no anomalies, no drift"
        )
    )
    return kind, text


def evaluation_weakest(evaluation: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return weakest_class(evaluation) if evaluation.get("gate") else None


def model_verdict(summary: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(ok | bad, text) about the model: its eval accuracy, the last blessed one's, blessing and push."""
    components = by_kind(summary)
    evaluation = components.get("Evaluator", {}).get("details") or {}
    if not evaluation:
        return None
    pushed = components.get("Pusher", {}).get("details") or {}
    if evaluation.get("task") == "multi":
        text = "eval " + describe_labels(evaluation)
        text += "; blessed" if evaluation["blessed"] else "; not blessed"
        if pushed.get("pushed"):
            text += f"; pushed to {pushed['destination']}"
        return ("ok" if evaluation["blessed"] else "bad"), text
    text = f"eval accuracy {evaluation['accuracy']:.4f}" if evaluation["accuracy"] is not None else ""
    if evaluation.get("balanced_accuracy") is not None:
        text += f", balanced accuracy {evaluation['balanced_accuracy']:.4f}"
    if evaluation["baseline_accuracy"] is not None:
        text += f" (last blessed: {evaluation['baseline_accuracy']:.4f})"
    weakest = evaluation_weakest(evaluation)
    if weakest:
        text += f"; weakest class {weakest['name']!r}: recall {weakest['recall']:.2f} ({weakest['support']:,} images)"
    text += "; blessed" if evaluation["blessed"] else "; not blessed"
    if pushed.get("pushed"):
        text += f"; pushed to {pushed['destination']}"
    return ("ok" if evaluation["blessed"] else "bad"), text
