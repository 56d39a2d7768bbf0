"""A model card (model_card.json's dict) as Markdown and as self-contained HTML: the same sections, in order.
What a person must write is shown as such ("TO FILL IN"), never left out."""

import html as _html
import re
from typing import Any, Dict, List, Optional, Sequence

from settings import declared
from trainer.hparams import HParams
from trainer.search import TUNED


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _sections(card: Dict[str, Any]) -> List[tuple]:
    """[(title, [lines of (label, value)], [tables of (headers, rows)])] for every format."""
    multi = card["evaluation"].get("task") == "multi"
    sections = [
        _model_section(card["model"], multi),
        _data_section(card["data"], card["model"], multi),
        _training_section(card["training"]),
        _evaluation_section(card["evaluation"], multi),
    ]
    test = card["evaluation"].get("test")
    if test:
        sections.append(_test_section(test, multi))
    if len(card.get("exports") or []) > 1:
        sections.append(_exports_section(card["exports"]))
    sections.append(
        ("For a person to write", [(key.replace("_", " "), value) for key, value in card["to_fill_in"].items()], [])
    )
    return sections


def _model_section(model: Dict[str, Any], multi: bool) -> tuple:
    return (
        "Model",
        [
            ("name", model["name"]),
            ("architecture", model.get("architecture_detail") or model["architecture"]),
            ("input", f"{model['image_size']} x {model['image_size']} pixels"),
            ("task", "multi-label: any number of the labels an image, each at its own threshold" if multi else None),
            ("labels" if multi else "classes", ", ".join(model["classes"])),
            ("created", model["created"]),
            ("framework", ", ".join(f"{k} {v}" for k, v in model["framework"].items())),
            ("serving", model["signature"]),
            ("artifact", model["artifact"]),
        ],
        [],
    )


def _data_section(data: Dict[str, Any], model: Dict[str, Any], multi: bool) -> tuple:
    noun = "label" if multi else "class"
    splits = sorted(data.get("per_split") or {})
    per_class_rows = [
        [name] + [(data.get("per_class_and_split") or {}).get(s, {}).get(name, 0) for s in splits]
        for name in model["classes"]
    ]
    return (
        "Data",
        [
            ("sources", ", ".join(data["sources"]) or None),
            ("layout", data["layout"]),
            ("span", data["span"]),
            ("files seen", data["files_seen"]),
            ("examples", data["examples"]),
            ("quarantined", data["quarantined"]),
            (
                "quarantine reasons",
                ", ".join(f"{k} {v}" for k, v in (data["quarantine_reasons"] or {}).items()) or None,
            ),
            ("class mix", _mix(data)),
            (
                "images without any label",
                ", ".join(f"{s} {n:,}" for s, n in (data.get("examples_without_labels") or {}).items()) or None,
            ),
            (
                "classes with too few eval images to judge",
                ", ".join(data.get("classes_with_few_eval_examples") or []) or None,
            ),
            ("review decisions applied", _review(data.get("review"))),
            ("duplicate files", data["duplicate_files"]),
            ("near-duplicate groups", data["near_duplicate_groups"]),
            ("eval examples with a near-duplicate in train", data["eval_with_near_duplicate_in_train"]),
            ("likely label errors", data["likely_label_errors"]),
        ],
        [([noun] + splits, per_class_rows)],
    )


def _exports_section(exports: List[Dict[str, Any]]) -> tuple:
    """The forms the model ships in, beside its SavedModel (docs/prediction.md: how to serve each)."""
    rows = [
        [
            e["name"],
            e.get("file") or "-",
            e.get("format") or "-",
            "-" if e.get("bytes") is None else f"{e['bytes'] / 2**20:.1f} MB",
            e.get("input") or "-",
            e.get("error") or e.get("agreement") or "-",
        ]
        for e in exports
    ]
    return ("Exports", [], [(("export", "file", "format", "size", "input", "agreement with the SavedModel"), rows)])


# The training settings a card lists: every declared one (trainer/hparams.py) and what the search tunes, from their
# declarations: a new setting is on the card with no edit here.
CARD_SETTINGS = {f.name for f in declared(HParams)} | set(TUNED)


def _training_section(training: Dict[str, Any]) -> tuple:
    lineage = training["lineage"]
    base = lineage.get("base_model") or {}
    return (
        "Training",
        [
            (
                "settings",
                ", ".join(
                    f"{k} {'-' if v in (None, '') else v}"
                    for k, v in sorted(training["settings"].items())
                    if k in CARD_SETTINGS
                ),
            ),
            ("tuned by the search", ", ".join(f"{k} {v}" for k, v in (training["tuned"] or {}).items()) or None),
            ("epochs trained", training["epochs"]),
            ("kept epoch", training["kept_epoch"]),
            ("device", training["device"]),
            ("seconds", None if training["seconds"] is None else f"{training['seconds']:.1f}"),
            ("warm-started from", training["warm_started_from"]),
            ("imbalanced classes", _balancing(training.get("class_balance"))),
            ("pipeline", lineage["pipeline"]),
            ("run", lineage["run"]),
            ("span", lineage["span"]),
            (
                "base model (last blessed)",
                f"{base.get('artifact')} (ML Metadata id {base.get('id')})" if base else None,
            ),
        ],
        [],
    )


def _evaluation_section(evaluation: Dict[str, Any], multi: bool) -> tuple:
    noun = "label" if multi else "class"
    threshold = evaluation.get("confidence_threshold") or {}
    at = evaluation.get("at_threshold") or {}
    return (
        "Evaluation",
        [
            ("split", f"{evaluation['split']} ({_fmt(evaluation['examples'])} examples)"),
            ("macro AUC-PR (mean over the labels)", evaluation.get("macro_auc_pr"))
            if multi
            else ("accuracy", evaluation["accuracy"]),
            ("macro F1 at the labels' thresholds", evaluation.get("macro_f1")) if multi else ("", None),
            ("weakest label (F1)", _weakest_label(evaluation.get("weakest_label"))) if multi else ("", None),
            ("label thresholds", evaluation.get("label_thresholds_how")) if multi else ("", None),
            ("balanced accuracy (mean recall of the classes)", evaluation.get("balanced_accuracy")),
            ("weakest class", _weakest(evaluation.get("weakest_class"))),
            (f"every {noun}", _class_gate(evaluation.get("class_gate"), noun)),
            (
                "confidence threshold",
                f"{threshold.get('threshold', 0):g}: {threshold.get('how', '')}" if threshold else None,
            ),
            (
                "at the threshold",
                ", ".join(f"{k} {_fmt(at.get(k))}" for k in ("precision", "recall", "coverage")) if at else None,
            ),
            ("blessed", evaluation["blessed"]),
            ("why", evaluation["blessing_reason"]),
            ("last blessed model", _last_blessed(evaluation.get("last_blessed"), multi)),
        ],
        [_per_class_table(evaluation["per_class"], multi)],
    )


def _test_section(test: Dict[str, Any], multi: bool) -> tuple:
    test_at = test.get("at_threshold") or {}
    return (
        "Test split",
        [
            ("examples", test["examples"]),
            ("accuracy", test["accuracy"]),
            ("balanced accuracy", test.get("balanced_accuracy")),
            ("weakest class", _weakest(test.get("weakest_class"))),
            (
                "at the threshold",
                ", ".join(f"{k} {_fmt(test_at.get(k))}" for k in ("precision", "recall", "coverage"))
                if test_at
                else None,
            ),
            ("macro AUC-PR", test.get("macro_auc_pr")),
            ("macro F1 at the eval split's thresholds", test.get("macro_f1")),
        ],
        [_per_class_table(test["per_class"], multi)],
    )


def _per_class_table(per_class, multi: bool) -> tuple:
    if multi:
        return (
            ["label", "threshold", "precision", "recall", "F1", "AUC-PR", "support"],
            [
                [
                    name,
                    m.get("threshold"),
                    m.get("precision"),
                    m.get("recall"),
                    m.get("f1"),
                    m.get("auc_pr"),
                    m.get("support"),
                ]
                for name, m in (per_class or {}).items()
            ],
        )
    return (
        ["class", "precision", "recall", "F1", "support"],
        [[name, m["precision"], m["recall"], m["f1"], m["support"]] for name, m in (per_class or {}).items()],
    )


def _last_blessed(last, multi: bool) -> Any:
    if not last:
        return None
    if multi:
        return f"macro AUC-PR {_fmt(last.get('macro_auc_pr'))} ({last['artifact']})"
    return f"accuracy {_fmt(last['accuracy'])} ({last['artifact']})"


def _weakest_label(weakest) -> Any:
    if not weakest:
        return None
    return (
        f"{weakest['name']}: F1 {weakest['f1']:.4f}, recall {weakest['recall']:.4f} at threshold "
        f"{weakest['threshold']:g} on {weakest['support']:,} eval images"
    )


def _mix(data: Dict[str, Any]) -> Any:
    ratio = data.get("imbalance_ratio")
    if ratio is None:
        return None
    return f"largest / smallest class in train {ratio:.1f}:1" + (" (imbalanced)" if ratio > 3 else "")


def _balancing(balancing) -> Any:
    if not balancing or balancing.get("mode") in (None, "off") and not (balancing.get("imbalance_ratio") or 0) > 3:
        return None
    if balancing.get("task") == "multi" or balancing.get("monitor") == "val_auc_pr":
        how = {"weights": "rare labels' positive examples weighted in the loss", "off": "not weighted"}
    else:
        how = {"weights": "loss weighted by class", "sampling": "class-balanced batches", "off": "not balanced"}
    return f"{how.get(balancing['mode'], balancing['mode'])}; the kept epoch followed {balancing.get('monitor')}"


def _weakest(weakest) -> Any:
    if not weakest:
        return None
    return f"{weakest['name']}: recall {weakest['recall']:.4f} on {weakest['support']:,} eval images" + (
        "" if weakest["judged"] else " (too few to judge)"
    )


def _class_gate(gate, noun: str = "class") -> Any:
    if not gate:
        return None
    few = gate.get("must_find") or []
    at = " at its threshold" if noun == "label" else ""
    compared = (gate.get("compared_on") or "").replace("_", " ").replace("auc pr", "AUC-PR")
    return (
        "blessing needs "
        + (
            f"macro AUC-PR at least {gate['min_macro_auc_pr']:.2f} and "
            if gate.get("min_macro_auc_pr") is not None
            else ""
        )
        + f"recall {gate['min_class_recall']:.2f}{at} on each {noun} with at least "
        f"{gate['min_eval_examples']} eval images ({len(gate['judged'])} judged)"
        + (f" and one eval image found of each of {len(few)} with fewer" if few else "")
        + (f"; compared with the last blessed model on {compared}" if compared else "")
    )


# Markdown's syntax characters that act inside a line (values are never at a line's start), escaped with a
# backslash: a class or file name is text, never emphasis, a link, code or a table cell's end.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md_text(value) -> str:
    """A value as Markdown text: HTML escaped (a class named <img onerror=...> stays text in every renderer:
    Python-Markdown, the Vertex console, wikis), Markdown's syntax characters backslash-escaped, one line."""
    text = " ".join(_fmt(value).split())  # line breaks and tabs would end a list item or a table row
    return _MARKDOWN_SPECIAL.sub(r"\\\1", _html.escape(text, quote=True))


def markdown(card: Dict[str, Any]) -> str:
    out = [
        f"# Model card: {md_text(card['model']['name'])}",
        "",
        "Written by the pipeline from ML Metadata and the run's artifacts; the last section is for a person.",
    ]
    for title, lines, tables in _sections(card):
        out += ["", f"## {title}", ""]
        out += [f"- **{label}**: {md_text(value)}" for label, value in lines if value is not None]
        for headers, rows in tables:
            if rows:
                out += ["", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                out += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    head = "".join(f"<th>{_html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def html_text(value) -> str:
    text = _html.escape(_fmt(value))
    return f"<mark>{text}</mark>" if text.startswith("TO FILL IN") else text


def html(card: Dict[str, Any]) -> str:
    parts = [
        f"<h1>Model card: {_html.escape(card['model']['name'])}</h1>",
        "<p>Written by the pipeline from ML Metadata and the run's artifacts; the last section is for a person.</p>",
    ]
    for title, lines, tables in _sections(card):
        parts.append(f"<section><h2>{_html.escape(title)}</h2><dl>")
        parts += [
            f"<dt>{_html.escape(label)}</dt><dd>{html_text(value)}</dd>" for label, value in lines if value is not None
        ]
        parts.append("</dl>")
        parts += [_table(headers, rows) for headers, rows in tables if rows]
        parts.append("</section>")
    style = (
        "body{font:14px system-ui,sans-serif;max-width:960px;margin:24px auto;color:#1b2430}"
        "dt{font-weight:600;margin-top:6px}dd{margin:0 0 4px 16px}table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #ccd;padding:3px 8px}mark{background:#fff3b0}"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>Model card: '
        f"{_html.escape(card['model']['name'])}</title><style>{style}</style></head><body>"
        + "".join(parts)
        + "</body></html>\n"
    )


def export_rows(log: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each form the model ships in (the SavedModel, then the --tflite and --exports ones): its file, format, size,
    input, and how it agrees with the SavedModel on eval (or why it was not made)."""
    rows = [
        {
            "name": "SavedModel",
            "file": ".",
            "format": "TensorFlow SavedModel (serving_default)",
            "input": "encoded images (JPEG, PNG, GIF, BMP) as bytes",
            "agreement": "the reference",
        }
    ]
    tflite = log.get("tflite") or {}
    if tflite.get("error"):
        rows.append({"name": "TFLite", "error": tflite["error"]})
    for kind, model in (tflite.get("models") or {}).items():
        rows.append(
            {
                "name": f"TFLite {kind}",
                "file": model["file"],
                "format": "TensorFlow Lite",
                "bytes": model["bytes"],
                "input": "uint8 RGB pixels, resized",
                "agreement": f"eval accuracy {model['accuracy']:.4f} "
                f"(SavedModel {tflite.get('savedmodel_accuracy')}) on {tflite.get('examples')} images",
            }
        )
    for kind, export in (log.get("exports") or {}).items():
        if export.get("error"):
            rows.append({"name": kind, "error": export["error"]})
        elif export.get("agreement") is not None:
            rows.append(
                {
                    **{k: export.get(k) for k in ("file", "format", "bytes", "input")},
                    "name": kind,
                    "agreement": f"{export.get('agreement_on', 'top-1')} {export['agreement']:.2%} of "
                    f"{export['examples']:,} eval images, probabilities within "
                    f"{export['max_difference']:.1e}",
                }
            )
        else:
            rows.append(
                {
                    **{k: export.get(k) for k in ("file", "format", "bytes", "input")},
                    "name": kind,
                    "agreement": export.get("checked") or "not scored",
                }
            )
    return rows


def _review(review) -> Optional[str]:
    """`imagepipe run --review`: how many images a person relabelled or excluded, and from which file."""
    if not review:
        return None
    text = f"{review['relabelled']:,} relabelled, {review['excluded']:,} excluded (from {review['file']})"
    return text + (
        f"; {review['not_applied']:,} decisions not applied (images gone or changed)" if review["not_applied"] else ""
    )
