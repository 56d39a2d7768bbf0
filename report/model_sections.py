"""The report's model sections: tuning (the search's trials), training (curves, device, settings) and
evaluation (per class at the confidence threshold, precision-recall, confusion matrices, misclassified
images, the test split, the blessing)."""

import os
from typing import Any, Dict, List, Optional

from components.evaluator import results as evaluation_results
from components.model_card.render import export_rows
from report import report_data
from report.report_html import (
    confusion_svg,
    esc,
    line_chart,
    png_url,
    section,
    table,
    thumbnail,
    tiles,
    unfinished,
    xy_chart,
)
from runs import run_text
from trainer import class_balance, model_trials


def tuning(components: Dict[str, Dict]) -> str:
    """The search (a run with a Tuner step only): score against trial, the trials' values, the winner."""
    if "Tuner" not in components:
        return ""
    missing = unfinished(components, "Tuner", "tuning", "Tuning", "The search")
    if missing:
        return missing
    d = components["Tuner"]["details"]
    results = d.get("results") or []
    if d["searched"]:
        body = (
            f"<p>This run searched: {len(results)} trials of {esc(d.get('algorithm') or '')} search "
            f"({esc(d['reason'])}), in {d['seconds']:.1f} s, each scored by its best epoch's "
            f"{run_text.objective_name(d)}.</p>"
        )
    else:
        body = (
            f"<p>This run reused the best values of the search of {esc(d.get('searched_at') or '')} "
            f"(<code>{esc(d.get('reused_from') or '')}</code>): {esc(d['reason'])}. "
            "<code>--retune</code> searches again.</p>"
        )
    best = d.get("best") or {}
    body += (
        f"<p>Best: <b>{esc(run_text.describe_values(best))}</b>"
        + (f", {run_text.objective_name(d)} {d['best_score']:.4f}" if d.get("best_score") is not None else "")
        + "; the Trainer trained with these values.</p>"
    )
    scores = [r.get("score") for r in results]
    so_far, running = [], None
    for score in scores:
        running = score if running is None or (score is not None and score > running) else running
        so_far.append(running)
    body += line_chart({"trial score": scores, "best so far": so_far}, f"{run_text.objective_name(d)} against trial")
    names = sorted({k for r in results for k in r.get("values", {})})
    top = max((s for s in scores if s is not None), default=None)
    rows = [
        [
            r["trial"],
            r.get("score"),
            *[r.get("values", {}).get(n) for n in names],
            "best" if top is not None and r.get("score") == top else "",
        ]
        for r in results
    ]
    body += table(["trial", run_text.objective_name(d), *names, ""], rows, numeric=[0, 1])
    return section("tuning", "Tuning", body)


def training(components: Dict[str, Dict]) -> str:
    missing = unfinished(components, "Trainer", "training", "Training", "Training")
    if missing:
        return missing
    d = components["Trainer"]["details"]
    log = report_data.training_log(d["model_run"])
    epochs = log["epochs"]
    body = (
        f"<p>Trained on <b>{esc(log['strategy'])}</b>: {len(epochs)} epochs in {log['train_seconds']:.1f} s"
        + (f", warm-started from <code>{esc(log['warm_started_from'])}</code>" if log.get("warm_started_from") else "")
        + (f", not warm-started ({esc(log['warm_start_skipped'])})" if log.get("warm_start_skipped") else "")
        + f". TensorBoard: <code>tensorboard --logdir {esc(d['model_run'])}</code></p>"
    )
    split = run_text.validated_on(d)
    if log.get("held_out"):
        held = log["held_out"]
        body += (
            f"<p>Every choice of training (early stopping, the kept epoch, the search's trials, the operating point "
            f"and the calibration) was measured on <b>{held['held_out_examples']:,} held-out train images</b> (a "
            f"stratified {held['share']:.0%} of each class's; {held['train_examples']:,} trained on), never on the "
            "eval split, which the Evaluator alone reads.</p>"
        )
    if d.get("still_improving"):
        body += (
            f'<p class="warn"><b>{esc(run_text.still_improving(d["still_improving"]))}</b>: the {split} figure the '
            "epoch is kept by was still rising when the epoch cap ended training, so more epochs would likely give "
            "a better model.</p>"
        )
    balancing = log.get("class_balance") or {}
    multi = balancing.get("task") == "multi"
    if balancing.get("imbalanced"):
        body += (
            f'<p class="warn">The train split is imbalanced ({esc(class_balance.describe_mix(balancing["counts"]))}'
            f"): {esc(run_text.describe_class_balance(balancing))}; early stopping and the kept epoch followed "
            f"{'macro AUC-PR' if multi else 'balanced accuracy'} (<code>--class-balance</code>).</p>"
        )
    body += _model_trials(log.get("model_trials"))
    body += _per_epoch(epochs, multi, split)
    body += _operating_point(log.get("operating_point"), log["class_names"])
    body += _on_device(log.get("tflite"))
    body += _other_runtimes(log.get("exports"))
    body += "<h3>Hyperparameters</h3>"
    if log.get("tuned"):
        body += f"<p>From the search (see Tuning): {esc(run_text.describe_values(log['tuned']))}.</p>"
    body += table(["name", "value"], sorted(log["hparams"].items()))
    return section("training", "Training", body)


def _per_epoch(epochs: List[Dict[str, Any]], multi: bool, split: str = "eval") -> str:
    """Loss and accuracy per epoch: two charts, then a table (`split`: what the val_ figures were measured on)."""
    loss = {"train loss": [e.get("loss") for e in epochs], f"{split} loss": [e.get("val_loss") for e in epochs]}
    accuracy = (
        {
            "train macro AUC-PR": [e.get("auc_pr") for e in epochs],
            f"{split} macro AUC-PR": [e.get("val_auc_pr") for e in epochs],
        }
        if multi
        else {
            "train accuracy": [e.get("sparse_categorical_accuracy") for e in epochs],
            f"{split} accuracy": [e.get("val_sparse_categorical_accuracy") for e in epochs],
            f"{split} balanced accuracy": [e.get("val_balanced_accuracy") for e in epochs],
        }
    )
    body = f'<div class="grid">{line_chart(loss, "loss per epoch")}{line_chart(accuracy, "accuracy per epoch")}</div>'
    return body + table(
        [
            "epoch",
            "phase",
            "seconds",
            "loss",
            "accuracy",
            f"{split} loss",
            f"{split} accuracy",
            f"{split} balanced accuracy",
        ],
        [
            [
                e["epoch"],
                e["phase"],
                f"{e['seconds']:.2f}",
                e.get("loss"),
                e.get("sparse_categorical_accuracy"),
                e.get("val_loss"),
                e.get("val_sparse_categorical_accuracy"),
                e.get("val_balanced_accuracy"),
            ]
            for e in epochs
        ],
        numeric=[0, 2, 3, 4, 5, 6, 7],
    )


OPERATING_POINT_ROWS = 30  # classes listed in the operating point's table, the weakest first


def _model_trials(record) -> str:
    """--model auto's candidates on photo-sized images (trainer/model_trials.py): each one's held-out figure, epochs
    and seconds, or why it was not tried; the kept one in bold."""
    if not record:
        return ""
    rows = [
        [
            f"<b>{esc(t['label'])}</b>" if t["name"] == record["kept"] else esc(t["label"]),
            t["figure"],
            t["epochs"] or None,
            f"{t['seconds']:.1f}" if t["seconds"] else None,
            t["note"],
        ]
        for t in record["candidates"]
    ]
    return (
        f"<h3>Model choice</h3><p><code>--model auto</code> ({esc(record['size_rule'])}): "
        f"each candidate scored on the held-out train images by {esc(class_balance.figure_name(record['figure']))}, "
        f"within <code>--auto-trial-minutes {record['budget_minutes']}</code>; a costlier one is kept only when it "
        f"beats the best so far by more than {model_trials.MIN_GAIN}.</p>"
        + table(["candidate", "held-out figure", "epochs", "seconds", "note"], rows, numeric=[1, 2, 3], raw=[0])
    )


def _operating_point(record, class_names) -> str:
    """How the model decides and how sure it is, on the held-out train images (trainer/operating_point.py): each
    class's recall at the head's argmax and at the chosen rule, and the reliability diagram before and after the
    temperature."""
    if not record or not record.get("held_out", {}).get("images") or "thresholds" in record:
        return ""  # a multi-label model's thresholds are shown with its evaluation
    held = record["held_out"]
    asked = record.get("asked", {}).get("recall", {})
    rows = [
        [name, before, after, asked.get(name)]
        for name, before, after in zip(class_names, held["argmax"]["recall"], held["chosen"]["recall"])
        if after is not None
    ]
    rows.sort(key=lambda r: (r[2], r[0]))
    verdict = (
        "meets what is asked" if record.get("meets") else f'<span class="bad">{esc(record.get("reason", ""))}</span>'
    )
    diagonal = [(0.0, 0.0), (1.0, 1.0)]
    reliability = xy_chart(
        {
            "perfect": diagonal,
            "before": [(b["confidence"], b["accuracy"]) for b in held["reliability_before"]],
            "after": [(b["confidence"], b["accuracy"]) for b in held["reliability_after"]],
        },
        "reliability on held-out train images",
        "confidence",
        "accuracy",
    )
    return (
        f"<h3>Operating point and calibration</h3><p>Rule <code>{esc(record['rule'])}</code> on "
        f"{held['images']:,} held-out train images: accuracy {held['argmax']['accuracy']:.3f} at the head's argmax -> "
        f"{held['chosen']['accuracy']:.3f}, balanced accuracy {held['argmax']['balanced_accuracy']:.3f} -> "
        f"{held['chosen']['balanced_accuracy']:.3f}; {verdict}. Temperature {record['temperature']:.2f}"
        + ("" if record.get("calibrated", True) else " (too few held-out mistakes to fit one)")
        + f": expected calibration error {held['ece_before']:.3f} -> {held['ece_after']:.3f}. Both are part of the "
        "pushed model (its last layer), so the SavedModel, TFLite, ONNX, Core ML and <code>imagepipe predict</code> "
        "decide alike.</p>"
        + reliability
        + _precision_recall(held.get("precision_recall") or {})
        + table(["class", "recall at argmax", "recall chosen", "asked"], rows[:OPERATING_POINT_ROWS], numeric=[1, 2, 3])
    )


PR_CHARTS = 6  # the weakest classes' precision-recall curves drawn (training.json keeps up to 20)


def _precision_recall(curves: Dict[str, Dict]) -> str:
    """The weakest classes' precision-recall curves on held-out train images (calibrated probabilities, one class
    against the rest), each with the point the chosen rule decides at."""
    charts = [
        xy_chart(
            {"held-out PR curve": [tuple(p) for p in c["curve"]]},
            f"{name}: precision against recall",
            "recall",
            "precision",
            dots={"chosen rule": tuple(c["chosen"])},
        )
        for name, c in list(curves.items())[:PR_CHARTS]
    ]
    return "".join(charts)


def _on_device(record) -> str:
    """The TFLite exports next to the SavedModel, scored on the same held-out train examples (older runs: eval)."""
    if not record:
        return ""
    if "error" in record:
        return f'<h3>On-device (TFLite)</h3><p class="bad">Export failed: {esc(record["error"])}</p>'
    rows = [["SavedModel", f"{record['savedmodel_accuracy']:.4f}", "", "serving_default (encoded image bytes)"]]
    rows += [
        [f"TFLite {kind}", f"{m['accuracy']:.4f}", f"{m['bytes'] / 1024:,.0f}", m["file"]]
        for kind, m in record["models"].items()
    ]
    return (
        f"<h3>On-device (TFLite)</h3><p>Accuracy on the same {record['examples']:,} "
        f"{record.get('scored_on', 'eval')} examples; the TFLite models take uint8 pixels resized to the model's "
        "input, with <code>tflite/labels.txt</code>.</p>"
        + table(["model", "accuracy", "KB", "file in the pushed model"], rows, numeric=[1, 2])
    )


def _other_runtimes(record) -> str:
    """The ONNX and Core ML exports (--exports): size, input, and how each agrees with the SavedModel."""
    if not record:
        return ""

    rows = [
        [
            e["name"],
            e.get("file") or "-",
            "-" if e.get("bytes") is None else f"{e['bytes'] / 2**20:.1f}",
            e.get("input") or "-",
            e.get("error") or e.get("agreement") or "-",
        ]
        for e in export_rows({"exports": record})[1:]
    ]
    return (
        "<h3>Other runtimes (ONNX, Core ML)</h3><p>Beside the SavedModel in every pushed model; they take the "
        "image already resized to the model's input (docs/prediction.md shows how to serve each).</p>"
        + table(["export", "file", "MB", "input", "agreement with the SavedModel"], rows, numeric=[2])
    )


def evaluation(components: Dict[str, Dict]) -> str:
    missing = unfinished(components, "Evaluator", "evaluation", "Evaluation", "Evaluation")
    if missing:
        return missing
    c = components["Evaluator"]
    d = c["details"]
    if d.get("task") == "multi":
        return section("evaluation", "Evaluation", _multi_label_evaluation(components, d))
    names = (components.get("Trainer", {}).get("details") or {}).get("class_names") or []
    body = _verdict(components, d, _blessing_reasons(c, d))
    body += table(
        ["metric", "value"],
        [
            ["accuracy", d["accuracy"]],
            ["balanced accuracy (mean recall of the classes)", d.get("balanced_accuracy")],
            ["eval examples", d["example_count"]],
            ["last blessed model's accuracy", d["baseline_accuracy"]],
            ["last blessed model's balanced accuracy", d.get("baseline_balanced_accuracy")],
        ],
        numeric=[1],
    )
    body += _scored_on(d.get("evaluated_on"))
    body += _every_class(d)
    card = components.get("ModelCard", {}).get("details") or {}
    if card.get("card_html"):
        body += f'<p>Model card: <a href="file://{esc(card["card_html"])}">{esc(card["card_html"])}</a>.</p>'
    views = d.get("views")
    if views:
        body += _threshold_views(views, "eval")
    elif d.get("per_class"):
        body += "<h3>Per class</h3>" + table(
            ["class", "precision", "recall", "eval examples"],
            [[name, m["precision"], m["recall"], m["support"]] for name, m in sorted(d["per_class"].items())],
            numeric=[1, 2, 3],
        )
    body += _confusion(names, d.get("confusion"), shares=True)
    body += _confusion(names, d.get("confusion"))
    body += _misclassified(d.get("misclassified") or {})
    body += explanations(d.get("explanations") or {})
    test = d.get("test")
    if test:
        body += _test_split(test, names)
    return section("evaluation", "Evaluation", body)


def _scored_on(on: Optional[Dict[str, Any]]) -> str:
    """What TFMA scored (components/evaluator/on_features.py): the heads on the features step's features, which the
    serving model agreed with, or the serving model on every eval image, and why."""
    if not on:
        return ""
    if on["on"] == "features":
        return (
            f"<p>Scored by the model's head on the features step's features of every eval image: the serving model "
            f"gave the same probabilities on the first {on['agreement_images']} (within "
            f"{on['largest_difference']:.1e}).</p>"
        )
    once = on.get("predictions")  # each model run once over the images, TFMA reading its probabilities
    ran = f" It ran once over {sum(once['images'].values()):,} images in {once['seconds']:.1f} s." if once else ""
    return f"<p>Scored by the serving model on every eval image ({esc(on.get('why') or '')}).{ran}</p>"


def _blessing_reasons(c: Dict[str, Any], d: Dict[str, Any]) -> str:
    """Why the Evaluator blessed the model or not: its accuracy against the threshold and the last blessed model."""
    threshold = evaluation_results.accuracy_threshold(c["outputs"]["evaluation"][0])
    reasons = []
    if d["accuracy"] is None:
        reasons.append("no accuracy was computed")
    elif threshold is not None:
        reasons.append(
            f"accuracy {d['accuracy']:.4f} {'≥' if d['accuracy'] >= threshold else '<'} threshold {threshold:.4f}"
        )
    if d["baseline_accuracy"] is not None and d["accuracy"] is not None:
        reasons.append(
            f"{'not below' if d['accuracy'] >= d['baseline_accuracy'] else 'below'} the last blessed "
            f"model's {d['baseline_accuracy']:.4f}"
        )
    elif d.get("baseline_skipped"):
        reasons.append(f"not compared with the last blessed model: {d['baseline_skipped']}")
    elif d["baseline_accuracy"] is None:
        reasons.append("no blessed model to compare with yet")
    return "; ".join(reasons)


def _test_split(test: Dict[str, Any], names) -> str:
    """The test split, scored apart."""
    body = (
        f'<h3 id="test">Test split</h3><p>Scored apart (it blesses nothing): accuracy '
        f"{esc(_fmt_or_dash(test['accuracy']))} on {test['example_count'] or 0:,} test examples.</p>"
    )
    if test.get("views"):
        body += _threshold_views(test["views"], "test", curves=False)
    return body + _confusion(names, test.get("confusion"))


def explanations(found: Dict[str, Any]) -> str:
    """Where the model looked (components/evaluator/explanations.py): each class's average map over its correctly
    classified images, then each explained image's map (misclassified first), true -> predicted (probability)."""
    if not found.get("images"):
        return ""

    def src(name: str):
        return _image_url(found["folder"], name, lambda data: thumbnail(data, size=128))

    body = (
        f'<h3 id="explanations">Where the model looked</h3><p class="muted">{esc(found["method"])} for the '
        f"predicted class, brighter where a pixel counts more; {len(found['images'])} of the "
        f"{found['examined']:,} eval images examined, the misclassified first ({found['seconds']:.1f} s; "
        "<code>--explanations N</code>, 0: none).</p>"
    )
    if found.get("classes"):
        body += "<h4>Each class, on average</h4>" + tiles(
            {"src": src(c["overlay"]), "caption": f"{c['name']} ({c['images']} images)"} for c in found["classes"]
        )
    body += "<h4>Eval images</h4>" + tiles(
        {
            "src": src(image["overlay"]),
            "caption": f"{image['actual'] or '(none)'} → {image['predicted']} "
            f"({image['probability']:.2f})" + ("" if image["correct"] else " ✗"),
        }
        for image in found["images"]
    )
    return body


def _verdict(components: Dict[str, Dict], d: Dict[str, Any], why: str) -> str:
    """Blessed or not and why, the failed checks, and where the Pusher put the model."""
    verdict = "BLESSED" if d["blessed"] else "NOT BLESSED"
    body = (
        f"<p><b>{verdict}</b>: {esc(why)}."
        + (f" Failed checks: {esc('; '.join(d['failures']))}." if d["failures"] else "")
        + "</p>"
    )
    pushed = components.get("Pusher", {}).get("details") or {}
    if pushed:
        body += (
            f"<p>Pushed to <code>{esc(pushed['destination'])}</code>.</p>"
            if pushed["pushed"]
            else "<p>Not pushed: the model was not blessed.</p>"
        )
    return body


def _multi_label_evaluation(components: Dict[str, Dict], d: Dict[str, Any]) -> str:
    """A multi-label model's evaluation: the verdict, macro AUC-PR and F1, each label at its own threshold, and
    each label's precision-recall curve with its threshold marked; the test split at the eval split's thresholds."""
    body = _verdict(components, d, run_text.describe_labels(d))
    gate = d.get("gate") or {}
    body += table(
        ["metric", "value"],
        [
            ["macro AUC-PR (mean over the labels)", d.get("macro_auc_pr")],
            ["macro F1 at the labels' thresholds", d.get("macro_f1")],
            ["macro precision", d.get("macro_precision")],
            ["macro recall", d.get("macro_recall")],
            ["blessing needs macro AUC-PR at least", gate.get("min_macro_auc_pr")],
            ["eval examples", d["example_count"]],
            ["last blessed model's macro AUC-PR", d.get("baseline_macro_auc_pr")],
        ],
        numeric=[1],
    )
    views = d.get("views") or {}
    judged = {gate["class_names"][i] for i in gate.get("judged") or []}
    body += (
        f"<h3>Each label at its threshold</h3><p>Thresholds: {esc((views.get('chosen') or {}).get('how', ''))}. "
        "A label applies when its probability is above its threshold; blessing needs recall "
        f"{gate.get('min_class_recall', 0):.2f} at its threshold on each label with at least "
        f"{gate.get('min_eval_examples', 0)} eval images (judged: yes).</p>"
    )
    body += _label_table(d.get("per_class") or {}, judged)
    body += explanations(d.get("explanations") or {})
    curves = {
        name: [
            (p["recall"], p["precision"])
            for p in label["curve"]
            if p["recall"] is not None and p["precision"] is not None
        ]
        for name, label in list((views.get("labels") or {}).items())[:MAX_CURVES]
    }
    if curves:
        body += (
            '<div class="charts">' + xy_chart(curves, "precision-recall per label", "recall", "precision") + "</div>"
        )
    test = d.get("test")
    if test:
        body += (
            f'<h3 id="test">Test split</h3><p>Scored apart at the eval split\'s thresholds (it blesses nothing): '
            f"macro AUC-PR {esc(_fmt_or_dash(test.get('macro_auc_pr')))}, macro F1 "
            f"{esc(_fmt_or_dash(test.get('macro_f1')))} on {test['example_count'] or 0:,} test examples.</p>"
        )
        body += _label_table(test.get("per_class") or {}, set())
    return body


def _label_table(per_class: Dict[str, Dict], judged) -> str:
    return table(
        ["label", "threshold", "precision", "recall", "F1", "AUC-PR", "eval images", "judged"],
        [
            [
                name,
                m.get("threshold"),
                m.get("precision"),
                m.get("recall"),
                m.get("f1"),
                m.get("auc_pr"),
                m.get("support"),
                "yes" if name in judged else "",
            ]
            for name, m in per_class.items()
        ],
        numeric=[1, 2, 3, 4, 5, 6],
    )


def _fmt_or_dash(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _every_class(d: Dict[str, Any]) -> str:
    """Each class's recall and precision on argmax predictions (TFMA: components/evaluator/metrics.py), the
    weakest class, and which classes the blessing held to --min-class-recall."""
    gate = d.get("gate")
    if not gate or not d.get("per_class"):
        return ""
    judged, must_find = set(gate["judged"]), set(gate.get("must_find") or [])
    weakest = evaluation_results.weakest_class(d)
    body = (
        f'<h3 id="every-class">Every class</h3><p>A model is blessed only if every class with at least '
        f"{gate['min_eval_examples']} eval images reaches recall {gate['min_class_recall']:.2f} "
        f"(<code>--min-class-recall</code>) and at least one eval image of every class with "
        f"{gate.get('min_eval_to_find', 3)} or more is found, besides the accuracy threshold"
        + (
            f"; the train split is imbalanced {gate['imbalance_ratio']:.1f}:1, so the last blessed model is "
            "compared on balanced accuracy"
            if gate.get("imbalanced")
            else ""
        )
        + "."
    )
    if weakest:
        body += (
            f" Weakest class: <b>{esc(weakest['name'])}</b>, recall {weakest['recall']:.2f} on "
            f"{weakest['support']:,} eval images" + ("" if weakest["judged"] else " (too few to judge)") + "."
        )
    body += "</p>"
    rows = []
    for i, name in enumerate(gate["class_names"]):
        m = d["per_class"].get(name) or {}
        support, recall = gate["eval_examples"][i], m.get("recall")
        verdict = (
            "below the floor"
            if i in judged and recall is not None and recall < gate["min_class_recall"]
            else "ok"
            if i in judged
            else "none found"
            if i in must_find and not recall
            else "found (too few eval images for the floor)"
            if i in must_find
            else "too few eval images"
        )
        rows.append([name, gate["train_examples"][i], support, recall, m.get("precision"), verdict])
    rows.sort(key=lambda r: (r[3] if r[3] is not None else 2.0, r[0]))
    return body + table(
        ["class", "train images", "eval images", "recall", "precision", "judged"], rows, numeric=[1, 2, 3, 4]
    )


MAX_CONFUSION_CLASSES = 30  # a matrix of more is k^2 cells (1,000 classes: 241 MB of SVG that hangs a browser)
CONFUSED_PAIRS = 20  # beyond it: the pairs most often confused, listed


def _confusion(names, confusion, shares: bool = False) -> str:
    """The confusion matrix, its classes in name order; past MAX_CONFUSION_CLASSES, the matrix of the classes in
    the most confusions, and (once, with the counts) a table of the most confused pairs."""
    if not names or not confusion:
        return ""
    cells: Dict[tuple, int] = {}
    for actual, predicted, count in confusion:
        if 0 <= actual < len(names) and 0 <= predicted < len(names):
            cells[actual, predicted] = cells.get((actual, predicted), 0) + count
    kept = range(len(names))
    note = pairs = ""
    if len(names) > MAX_CONFUSION_CLASSES:
        mistakes: Dict[int, int] = {}
        for (actual, predicted), count in cells.items():
            if actual != predicted:
                mistakes[actual] = mistakes.get(actual, 0) + count
                mistakes[predicted] = mistakes.get(predicted, 0) + count
        kept = sorted(mistakes, key=lambda i: (-mistakes[i], names[i]))[:MAX_CONFUSION_CLASSES]
        note = (
            f"<p>{len(names):,} classes: the {len(kept)} classes in the most confusions are drawn"
            + ("" if shares else ", and the most confused pairs listed")
            + ".</p>"
        )
        confused = sorted(((c, a, p) for (a, p), c in cells.items() if a != p), key=lambda t: (-t[0], t[1], t[2]))
        if not shares and confused:
            pairs = table(
                ["actual", "predicted", "images"],
                [[names[a], names[p], c] for c, a, p in confused[:CONFUSED_PAIRS]],
                numeric=[2],
            )
    order = sorted(kept, key=lambda i: names[i])
    matrix = [[cells.get((i, j), 0) for j in order] for i in order]
    title = (
        "Confusion matrix, each row as shares of its class (the diagonal is recall)"
        if shares
        else "Confusion matrix (counts)"
    )
    totals = [sum(c for (a, _), c in cells.items() if a == i) for i in order]
    svg = confusion_svg(matrix, [names[i] for i in order], shares=shares, row_totals=totals)
    return f"<h3>{title}</h3>" + note + svg + pairs


MAX_CURVES = 10  # per-class precision-recall curves drawn (the classes with the most examples)


def _threshold_views(views: Dict[str, Any], split: str, curves: bool = True) -> str:
    """AutoML's evaluation views (components/evaluator/views.py, computed by the Evaluator): per class at the
    chosen confidence threshold, how precision, recall and coverage move with it, precision-recall curves."""
    chosen, at = views["chosen"], views.get("at_threshold") or {}
    body = (
        f"<h3>Per class at confidence threshold {chosen['threshold']:g}</h3><p>Threshold: {esc(chosen['how'])}."
        f' At or below it the model answers "unsure" (<code>imagepipe predict</code>); at it, on the {split} split: '
        f"precision {_fmt_or_dash(at.get('precision'))}, recall {_fmt_or_dash(at.get('recall'))}, coverage "
        f"{_fmt_or_dash(at.get('coverage'))} (the share of images given a class).</p>"
    )
    body += table(
        ["class", "precision", "recall", "F1", f"{split} examples", "predicted"],
        [
            [name, m["precision"], m["recall"], m["f1"], m["support"], m["predicted"]]
            for name, m in sorted(at.get("per_class", {}).items())
        ],
        numeric=[1, 2, 3, 4, 5],
    )
    if not curves:
        return body
    curve = views["curve"]
    moving = {name: [(p["threshold"], p[name]) for p in curve] for name in ("precision", "recall", "coverage")}
    overall = {"all classes": [(p["recall"], p["precision"]) for p in curve]}
    biggest = sorted(at.get("per_class", {}), key=lambda n: -at["per_class"][n]["support"])[:MAX_CURVES]
    per_class = {
        name: [(p["per_class"][name]["recall"], p["per_class"][name]["precision"]) for p in curve] for name in biggest
    }
    body += (
        '<h3>Confidence threshold</h3><div class="grid">'
        + xy_chart(moving, "as the threshold moves", "confidence threshold", "share", marker_x=chosen["threshold"])
        + xy_chart(overall, "precision-recall, overall", "recall", "precision")
        + xy_chart(
            per_class,
            "precision-recall per class"
            + (f" ({MAX_CURVES} largest)" if len(at.get("per_class", {})) > MAX_CURVES else ""),
            "recall",
            "precision",
        )
        + "</div>"
    )
    body += table(
        ["threshold", "precision", "recall", "coverage"],
        [[p["threshold"], p["precision"], p["recall"], p["coverage"]] for p in curve[::4]],
        numeric=[0, 1, 2, 3],
    )
    return body


def _misclassified(listed: Dict[str, Any]) -> str:
    """The eval images the trained model gets wrong, as the Evaluator recorded them (components/evaluator/
    misclassified.py)."""
    if not listed:
        return ""
    if not listed["images"]:
        return f"<h3>Misclassified eval images</h3><p>None among the {listed['examined']:,} eval images checked.</p>"

    tiles_ = [
        {
            # no thumbnail: the image did not decode
            "src": w["thumbnail"] and _image_url(listed["folder"], w["thumbnail"], png_url),
            "caption": f"{w['actual']} → {w['predicted']} ({w['probability']:.2f})",
        }
        for w in listed["images"]
    ]
    return (
        f'<h3>Misclassified eval images</h3><p class="muted">true class → predicted (probability); '
        f"the first {len(tiles_)} of the {listed['examined']:,} eval images checked.</p>" + tiles(tiles_)
    )


def _image_url(folder: str, name: str, as_url) -> Optional[str]:
    """as_url(the bytes) of an image the Evaluator wrote into `folder` (explanations/, misclassified/), None where it
    cannot be read."""
    try:
        with open(os.path.join(folder, name), "rb") as f:
            return as_url(f.read())
    except OSError:
        return None
