"""One self-contained HTML report per run: `imagepipe report [RUN]`, and the end of `imagepipe run`.

Read in a minute: was the data clean, is the model good? Then the details:
  data         files seen, examples per split and class, quarantined files with reasons
               (and thumbnails where they decode), duplicates, the label map
  validation   the anomalies and the schema (TFDV's own tables), statistics per split
  data health  near-duplicates (across splits, conflicting labels), likely label errors, outliers and
               poor images, each with thumbnails; drift in feature space
  tuning       (--tune) the search's trials: score against trial, each trial's values, the winner, and
               whether this run searched or reused the last search, and why
  training     loss and accuracy per epoch, device, hyperparameters, time per epoch
  evaluation   overall and per-class metrics, the confusion matrix, misclassified eval images,
               the blessing decision and why, where the model was pushed
  timings      every component, with the run and ML Metadata ids

A failed run gets a report too: what completed, and the failing component with its error.
TFDV's Facets statistics view loads its code from the network, so the statistics here are
rendered from the same protos as plain tables.
"""

import datetime
import os
from typing import Any, Dict, Optional

from components import drift as drift_lib
from components import evaluation_results
from components.image_example_gen.sources import split_sort_key
from report import report_data
from runs import run_text
from storage import user_files
from pipeline.config import ConfigError
from report.report_html import (confusion_svg, document, esc, histogram_svg, line_chart, share_bar, table,
                                  thumbnail, tiles, xy_chart)

MAX_QUARANTINE_ROWS = 200
MAX_THUMBNAILS = 48
MAX_EVAL_EXAMPLES = 2000
MAX_MISCLASSIFIED = 36


def report_path(root: str, pipeline_name: str, run_id: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in run_id)
    return os.path.join(root, "reports", pipeline_name, f"{safe}.html")


def build(summary: Dict[str, Any], out_path: str, pipeline_name: str = "") -> str:
    """Writes the report of a run, as run_summary.summarize() describes it, to out_path; returns the path."""
    components = {c["component"]: c for c in summary["components"]}
    sections = [_verdict(summary), _data(components), _validation(components), _health(components),
                _tuning(components), _training(components), _evaluation(components), _timings(summary)]
    started = datetime.datetime.fromtimestamp(summary["started_ms"] / 1000, datetime.timezone.utc)
    header = (f"<h1>{esc(pipeline_name or 'imagepipe')} — run {esc(summary['run_id'])}</h1>"
              f"<div class=\"meta\">status: <b>{esc(summary['status'])}</b> · started "
              f"{started:%Y-%m-%d %H:%M:%S} UTC · ML Metadata {esc(summary['metadata_path'])}</div>")
    text = document(f"imagepipe run {summary['run_id']}", header, "".join(s for s in sections if s))
    try:
        return user_files.write_whole(out_path, text.encode("utf-8"), "--out")
    except ConfigError as e:
        raise ReportError(str(e)) from None


class ReportError(OSError):
    """The report cannot be written where asked; one line naming the path and the fix."""


def _section(key: str, title: str, body: str) -> str:
    return f"<section id=\"{key}\"><h2>{esc(title)}</h2>{body}</section>"


def _not_reached(name: str) -> str:
    return f"<p class=\"muted\">{esc(name)} did not run in this run.</p>"


def _unfinished(components: Dict[str, Dict], name: str, key: str, title: str, what: str) -> Optional[str]:
    """The section for a component that did not run or did not finish; None when it has details."""
    c = components.get(name)
    if c and c["details"]:
        return None
    if c and c.get("missing"):
        return _section(key, title, f"<p>{esc(what)} ran, but its outputs are no longer on disk: "
                                    f"<code>{esc(c['missing'][0])}</code>.</p>")
    return _section(key, title, _not_reached(name) if not c else f"<p>{what} did not complete (see Summary).</p>")


# --- summary ------------------------------------------------------------------------------------


def _verdict(summary: Dict[str, Any]) -> str:
    cards = []
    for title, verdict in (("Data", run_text.data_verdict(summary)), ("Model", run_text.model_verdict(summary))):
        if verdict:
            kind, text = verdict
            cards.append(f"<div class=\"card {kind}\"><b>{title}</b><br>{esc(text)}</div>")
    failed = next((c for c in summary["components"] if c["state"] == "FAILED"), None)
    body = f"<div class=\"verdict\">{''.join(cards)}</div>"
    if failed:
        body += (f"<h3>Failed at {esc(failed['component'])}</h3>"
                 f"<div class=\"err\">{esc(failed['error'] or 'no error message recorded')}</div>")
    elif summary["status"] == "running":
        body += "<p class=\"muted\">The run has not finished: the report shows what has completed so far.</p>"
    elif summary["status"] == "interrupted":
        body += ("<h3>Interrupted</h3><p>The run was stopped (Ctrl-C, a signal, or a killed process) before it "
                 "finished; below is what completed. The next run reuses it from the cache.</p>")
    return _section("summary", "Summary", body)


# --- data ---------------------------------------------------------------------------------------


def _data(components: Dict[str, Dict]) -> str:
    missing = _unfinished(components, "ImageExampleGen", "data", "Data", "Ingestion")
    if missing:
        return missing
    d = components["ImageExampleGen"]["details"]
    splits = sorted(d["examples_per_split"], key=split_sort_key)
    classes = sorted(d["label_map"], key=d["label_map"].get)
    rows = [[name, d["label_map"][name]] + [d["examples_per_split_and_class"].get(s, {}).get(name, 0) for s in splits]
            + [sum(d["examples_per_split_and_class"].get(s, {}).get(name, 0) for s in splits)] for name in classes]
    rows.append(["all classes", ""] + [d["examples_per_split"][s] for s in splits] + [d["examples_written"]])
    body = (f"<p>{d['files_seen']:,} files read from <code>{esc(d['source'])}</code> ({esc(d['layout'])} layout): "
            f"{d['examples_written']:,} examples written, {d['quarantined']:,} quarantined, "
            f"{d['skipped_hidden']:,} hidden file{'' if d['skipped_hidden'] == 1 else 's'} skipped. Formats: "
            + ", ".join(f"{esc(k)} {v:,}" for k, v in d["formats"].items()) + ".</p>")
    if d.get("downscaled"):
        body += (f"<p>{d['downscaled']:,} of the examples hold a downscaled copy of their image (the files are "
                 f"larger than {d['store_max_pixels']:,} pixels, <code>--store-max-pixels</code>); their "
                 "original size and hash are in <code>image/original/height</code>, <code>image/original/width"
                 "</code> and <code>image/key/sha256</code>.</p>")
    body += "<h3>Examples per split and class (the label map's ids)</h3>"
    body += table(["class", "id"] + splits + ["total"], rows, numeric=range(1, len(splits) + 3))
    if d["quarantined"]:
        body += "<h3>Quarantined files</h3>" + table(["reason", "files"], d["quarantine_reasons"].items(), numeric=[1])
        body += _quarantine_rows(d, components["ImageExampleGen"]["properties"].get("input_base", ""))
    if d.get("duplicate_groups"):
        body += (f"<h3>Duplicates</h3><p>{d['duplicate_files']} files in {d['duplicate_groups']} groups of "
                 "identical content (kept in one split, or quarantined as shown above); for example:</p>")
        body += table(["identical files"], [[", ".join(g)] for g in d["duplicate_examples"][:10]])
    if d.get("classes_without_examples"):
        body += f"<p class=\"muted\">Classes with no valid image: {esc(', '.join(d['classes_without_examples']))}</p>"
    return _section("data", "Data", body)


def _quarantine_rows(details: Dict, input_base: str) -> str:
    shown, total, files = report_data.quarantine(details, input_base, MAX_QUARANTINE_ROWS)
    thumbs = []
    for row, data in files:
        src = thumbnail(data)  # None for a file that does not decode
        if src:
            thumbs.append({"src": src, "caption": f"{row['path']} ({row['reason']})"})
        if len(thumbs) == MAX_THUMBNAILS:
            break
    out = table(["path", "reason", "detail", "label"],
                [[r["path"], r["reason"], r["detail"], r["label"]] for r in shown])
    if total > len(shown):
        out += f"<p class=\"muted\">… and {total - len(shown):,} more in {esc(details['quarantine_csv'])}</p>"
    if thumbs:
        out += "<h3>Quarantined files that still decode</h3>" + tiles(thumbs)
    return out


# --- data health --------------------------------------------------------------------------------

MAX_HEALTH_ROWS = 50  # of the suspects and outliers (health.json keeps 50; the CSV files keep all)
MAX_NEAR_DUPLICATE_GROUPS = 12


def _health(components: Dict[str, Dict]) -> str:
    ingest = (components.get("ImageExampleGen") or {}).get("details") or {}
    health = components.get("DataHealth")
    if not ingest and not health:
        return ""
    input_base = (components.get("ImageExampleGen") or {}).get("properties", {}).get("input_base", "")

    def tile(path: str, caption: str) -> Optional[Dict[str, str]]:
        data = report_data.input_file(input_base, path)
        src = data and thumbnail(data)
        return {"src": src, "caption": caption} if src else None

    body = ""
    if components.get("DataHealthGate", {}).get("state") == "FAILED":
        body += ("<p><b>The data health check stopped the run</b> (the Summary has its message; "
                 "<code>--gate warn</code> makes it a warning).</p>")
    body += "<h3>Near-duplicates</h3>"
    if not ingest.get("near_duplicate_groups"):
        body += ("<p>No near-duplicates: no two images are resized, recompressed or slightly cropped copies of "
                 "each other.</p>" if ingest else _not_reached("ImageExampleGen"))
    else:
        body += (f"<p>{esc(run_text.describe_near_duplicates(ingest))}; "
                 f"{ingest['near_duplicate_within_class']:,} groups stay within a class. Every group is in "
                 f"<code>{esc(ingest['near_duplicates_csv'])}</code>"
                 + ("; with <code>--near-duplicates drop</code> one copy of each group with one label is kept."
                    if not ingest.get("near_duplicates_dropped") else ".") + "</p>")
        for n, group in enumerate(ingest["near_duplicate_examples"][:MAX_NEAR_DUPLICATE_GROUPS], start=1):
            labels = {label for _, label, _ in group}
            kind = ("conflicting labels" if len(labels) > 1 else
                    "train and eval" if len({split for _, _, split in group}) > 1 else "one split")
            shown = [t for t in (tile(path, f"{path} ({label}, {split})") for path, label, split in group) if t]
            body += (f"<h4>Group {n}: {esc(kind)}</h4>" + (tiles(shown) if shown else table(
                ["path", "label", "split"], group)))
    if not health:
        return _section("health", "Data health", body + _not_reached("DataHealth"))
    d = health["details"]
    if not d:
        return _section("health", "Data health", body + "<p>DataHealth did not complete (see Summary).</p>")
    body += "<h3>Likely label errors</h3>"
    if d.get("label_issue_fraction") is None:
        body += ("<p class=\"muted\">Labels were not checked"
                 + (f": {esc(d['label_check_skipped'])}" if d.get("label_check_skipped") else
                    " (the check runs with the transfer models' features, or with <code>--label-check on</code>).")
                 + "</p>")
    elif not d["label_issues"]:
        body += (f"<p>None found among {d['examples']:,} examples ({esc(d.get('label_check_method', ''))}; "
                 f"{esc(run_text.describe_label_model(d['label_check_accuracy']))}).</p>")
    else:
        body += (f"<p>{d['label_issues']:,} of {d['examples']:,} examples ({d['label_issue_fraction']:.1%}) look "
                 f"mislabelled: their given label gets a low probability from a model that never saw them "
                 f"({esc(d['label_check_method'])}, ranked by confident learning, most likely first; "
                 f"{esc(run_text.describe_label_model(d['label_check_accuracy']))}). Nothing "
                 f"was relabelled or dropped; review <code>{esc(d['label_issues_csv'])}</code>.</p>")
        rows = d["label_issue_examples"][:MAX_HEALTH_ROWS]
        shown = [t for t in (tile(r["path"], f"{r['given']} → {r['suggested']} ({float(r['given_probability']):.2f})")
                             for r in rows) if t]
        if shown:
            body += "<p class=\"muted\">given label → suggested label (probability of the given one)</p>" + tiles(shown)
        body += table(["rank", "path", "split", "given", "suggested", "probability of the given label"],
                      [[r["rank"], r["path"], r["split"], r["given"], r["suggested"], r["given_probability"]]
                       for r in rows])
    body += "<h3>Outliers and poor images</h3>"
    if not d["outliers"]:
        body += "<p>None: no nearly blank, very dark or bright, extremely elongated or far-off image.</p>"
    else:
        rows = d["outlier_examples"][:MAX_HEALTH_ROWS]
        shown = [t for t in (tile(r["path"], f"{r['label']}: {r['reasons']}") for r in rows) if t]
        body += (f"<p>{d['outliers']:,} images; all are in <code>{esc(d['outliers_csv'])}</code>.</p>"
                 + (tiles(shown) if shown else "")
                 + table(["path", "split", "label", "reasons"], [[r["path"], r["split"], r["label"], r["reasons"]]
                                                                  for r in rows]))
    body += "<h3>Drift in feature space</h3>"
    if d.get("feature_drift") is not None:
        body += (f"<p>The backbone features of this data moved {d['feature_drift']:.3f} from the last blessed "
                 f"model's (standardised mean shift; limit {d['limits']['max_feature_drift']:.3f}, "
                 "<code>--max-feature-drift</code>).</p>")
    else:
        body += ("<p class=\"muted\">Not measured: " + esc(d.get("feature_drift_skipped") or
                 "it needs a transfer model's features and a blessed model to compare with") + ".</p>")
    if d.get("problems"):
        body += "<h3>Over the limits</h3>" + table(["check", "finding", "option"],
                                                    [[p["check"], p["text"], p["option"]] for p in d["problems"]])
    return _section("health", "Data health", body)


# --- validation ---------------------------------------------------------------------------------


def _validation(components: Dict[str, Dict]) -> str:
    validator = components.get("ExampleValidator")
    if not validator:
        return _section("validation", "Data validation", _not_reached("ExampleValidator"))
    from tensorflow_data_validation.utils import display_util  # TFDV's own anomaly and schema tables

    body = ""
    anomalies_uri = (validator["outputs"].get("anomalies") or [None])[0]
    found = (validator["details"] or {}).get("anomalies", [])
    gate = components.get("DataValidationGate", {})
    if gate.get("state") == "FAILED":
        body += ("<p><b>The validation gate stopped the run</b> because of the anomalies or the drift below "
                 "(the Summary has its message).</p>")
    if not found:
        body += "<p>No anomalies: every split matches the schema.</p>"
    elif anomalies_uri:
        for split, proto in report_data.anomalies(anomalies_uri):
            body += f"<h3>Anomalies in {esc(split)}</h3>" + display_util.get_anomalies_dataframe(proto).to_html()
    body += _drift(components.get("DataValidationGate"))
    schema_component = components.get("ImportSchemaGen") or components.get("SchemaGen")
    schema = report_data.schema((schema_component or {}).get("details", {}).get("schema"))
    if schema is not None:
        features, domains = display_util.get_schema_dataframe(schema)
        origin = "curated (ImportSchemaGen)" if "ImportSchemaGen" in components else "inferred (SchemaGen)"
        body += f"<h3>Schema in use: {origin}</h3>" + features.to_html()
        if len(domains):
            body += domains.to_html()
    body += _statistics(components.get("StatisticsGen"))
    return _section("validation", "Data validation", body)


def _drift(gate: Optional[Dict]) -> str:
    """The new data beside the latest blessed model's, per compared distribution (components/drift.py)."""
    result = ((gate or {}).get("details") or {}).get("drift")
    if not result:
        return ""
    out = "<h3>Drift from the last blessed model's data</h3>"
    if "skipped" in result:
        return out + f"<p class=\"muted\">Not checked: {esc(result['skipped'])}.</p>"
    classes = drift_lib.describe_classes(result)
    if classes:
        out += f"<p><b>Class change</b>: {esc(classes)}.</p>"
    rows = []
    for check in result["checks"]:
        verdict = "DRIFTED" if check["drifted"] else "ok"
        rows.append([check["feature"], check["metric"], check["distance"], check["threshold"], verdict])
    out += table(["distribution", "distance", "value", "threshold", "verdict"], rows, numeric=[2, 3])
    for check in result["checks"]:
        if check["metric"] == "drop":
            continue
        before, now = drift_lib.shares(check["reference"]), drift_lib.shares(check["current"])
        keys = sorted(set(before) | set(now), key=lambda k: (-max(before.get(k, 0), now.get(k, 0)), k))[:30]
        out += (f"<h3>{esc(check['feature'])}: {'DRIFTED' if check['drifted'] else 'ok'} "
                f"(L-infinity {check['distance']:.3f}, threshold {check['threshold']:.3f})</h3>")
        out += table([check["feature"], "last blessed model's data", "this run's data", "examples then", "now"],
                     [[k, share_bar(before.get(k, 0.0), color="#888"), share_bar(now.get(k, 0.0)),
                       check["reference"].get(k, 0), check["current"].get(k, 0)] for k in keys],
                     numeric=[3, 4], raw=[1, 2])
    return out


def _statistics(component: Optional[Dict]) -> str:
    if not component or not component["outputs"].get("statistics"):
        return ""
    out = ("<h3>Statistics</h3><p class=\"muted\">From StatisticsGen's protos (TFDV's Facets view needs the "
           "network, so it is not embedded).</p>")
    for split, dataset in report_data.statistics(component["outputs"]["statistics"][0]):
        rows = []
        for feature in sorted(dataset.features, key=lambda f: f.path.step[0] if f.path.step else f.name):
            name = "/".join(feature.path.step) or feature.name
            kind = feature.WhichOneof("stats")
            if kind == "num_stats":
                s = feature.num_stats
                common = s.common_stats
                hist = next((h for h in s.histograms if h.type == 0), None)
                buckets = [(b.low_value, b.high_value, b.sample_count) for b in hist.buckets] if hist else []
                summary = f"mean {s.mean:.4g}, min {s.min:.4g}, max {s.max:.4g}"
                rows.append([name, "int/float", common.num_non_missing, common.num_missing, summary,
                             histogram_svg(buckets)])
            elif kind == "string_stats":
                s = feature.string_stats
                formats = next((c.rank_histogram for c in feature.custom_stats if c.name == "image_format_histogram"),
                               None)
                if formats is not None:  # TFDV's image domain stats: the bytes are images
                    values = "images: " + ", ".join(f"{b.label} {b.sample_count:,.0f}" for b in formats.buckets)
                else:
                    values = f"{s.unique:,} unique; top: " + ", ".join(
                        f"{v.value[:24]} ({v.frequency:,.0f})" for v in s.top_values[:5])
                rows.append([name, "string", s.common_stats.num_non_missing, s.common_stats.num_missing, values, ""])
            elif kind == "bytes_stats":
                s = feature.bytes_stats
                rows.append([name, "bytes", s.common_stats.num_non_missing, s.common_stats.num_missing,
                             f"{s.unique:,} unique, {s.avg_num_bytes:,.0f} bytes on average", ""])
        out += (f"<h3>{esc(split)}: {dataset.num_examples:,} examples</h3>"
                + table(["feature", "type", "present", "missing", "values", "histogram"], rows, numeric=[2, 3],
                        raw=[5]))
    return out


# --- training -----------------------------------------------------------------------------------


def _tuning(components: Dict[str, Dict]) -> str:
    """The search (a run with a Tuner step only): score against trial, the trials' values, the winner."""
    if "Tuner" not in components:
        return ""
    missing = _unfinished(components, "Tuner", "tuning", "Tuning", "The search")
    if missing:
        return missing
    d = components["Tuner"]["details"]
    results = d.get("results") or []
    if d["searched"]:
        body = (f"<p>This run searched: {len(results)} trials of {esc(d.get('algorithm') or '')} search "
                f"({esc(d['reason'])}), in {d['seconds']:.1f} s, each scored by its best epoch's eval accuracy.</p>")
    else:
        body = (f"<p>This run reused the best values of the search of {esc(d.get('searched_at') or '')} "
                f"(<code>{esc(d.get('reused_from') or '')}</code>): {esc(d['reason'])}. "
                "<code>--retune</code> searches again.</p>")
    best = d.get("best") or {}
    body += (f"<p>Best: <b>{esc(run_text.describe_values(best))}</b>"
             + (f", eval accuracy {d['best_score']:.4f}" if d.get("best_score") is not None else "")
             + "; the Trainer trained with these values.</p>")
    scores = [r.get("score") for r in results]
    so_far, running = [], None
    for score in scores:
        running = score if running is None or (score is not None and score > running) else running
        so_far.append(running)
    body += line_chart({"trial score": scores, "best so far": so_far}, "eval accuracy against trial")
    names = sorted({k for r in results for k in r.get("values", {})})
    top = max((s for s in scores if s is not None), default=None)
    rows = [[r["trial"], r.get("score"), *[r.get("values", {}).get(n) for n in names],
             "best" if top is not None and r.get("score") == top else ""] for r in results]
    body += table(["trial", "eval accuracy", *names, ""], rows, numeric=[0, 1])
    return _section("tuning", "Tuning", body)


def _training(components: Dict[str, Dict]) -> str:
    missing = _unfinished(components, "Trainer", "training", "Training", "Training")
    if missing:
        return missing
    d = components["Trainer"]["details"]
    log = report_data.training_log(d["model_run"])
    epochs = log["epochs"]
    body = (f"<p>Trained on <b>{esc(log['strategy'])}</b>: {len(epochs)} epochs in {log['train_seconds']:.1f} s"
            + (f", warm-started from <code>{esc(log['warm_started_from'])}</code>" if log.get("warm_started_from") else "")
            + (f", not warm-started ({esc(log['warm_start_skipped'])})" if log.get("warm_start_skipped") else "")
            + f". TensorBoard: <code>tensorboard --logdir {esc(d['model_run'])}</code></p>")
    if d.get("still_improving"):
        body += (f"<p class=\"warn\"><b>{esc(run_text.still_improving(d['still_improving']))}</b>: the eval loss was "
                 "still falling when the epoch cap ended training, so more epochs would likely give a better "
                 "model.</p>")
    loss = {"train loss": [e.get("loss") for e in epochs], "eval loss": [e.get("val_loss") for e in epochs]}
    accuracy = {"train accuracy": [e.get("sparse_categorical_accuracy") for e in epochs],
                "eval accuracy": [e.get("val_sparse_categorical_accuracy") for e in epochs]}
    body += f"<div class=\"grid\">{line_chart(loss, 'loss per epoch')}{line_chart(accuracy, 'accuracy per epoch')}</div>"
    body += table(["epoch", "phase", "seconds", "loss", "accuracy", "eval loss", "eval accuracy"],
                  [[e["epoch"], e["phase"], f"{e['seconds']:.2f}", e.get("loss"), e.get("sparse_categorical_accuracy"),
                    e.get("val_loss"), e.get("val_sparse_categorical_accuracy")] for e in epochs],
                  numeric=[0, 2, 3, 4, 5, 6])
    body += _on_device(log.get("tflite"))
    body += "<h3>Hyperparameters</h3>"
    if log.get("tuned"):
        body += f"<p>From the search (see Tuning): {esc(run_text.describe_values(log['tuned']))}.</p>"
    body += table(["name", "value"], sorted(log["hparams"].items()))
    return _section("training", "Training", body)


def _on_device(record) -> str:
    """The TFLite exports next to the SavedModel, scored on the same eval examples."""
    if not record:
        return ""
    if "error" in record:
        return f"<h3>On-device (TFLite)</h3><p class=\"bad\">Export failed: {esc(record['error'])}</p>"
    rows = [["SavedModel", f"{record['savedmodel_accuracy']:.4f}", "", "serving_default (encoded image bytes)"]]
    rows += [[f"TFLite {kind}", f"{m['accuracy']:.4f}", f"{m['bytes'] / 1024:,.0f}", m["file"]]
             for kind, m in record["models"].items()]
    return (f"<h3>On-device (TFLite)</h3><p>Accuracy on the same {record['examples']:,} eval examples; "
            "the TFLite models take uint8 pixels resized to the model's input, with <code>tflite/labels.txt</code>.</p>"
            + table(["model", "eval accuracy", "KB", "file in the pushed model"], rows, numeric=[1, 2]))


# --- evaluation ---------------------------------------------------------------------------------


def _evaluation(components: Dict[str, Dict]) -> str:
    missing = _unfinished(components, "Evaluator", "evaluation", "Evaluation", "Evaluation")
    if missing:
        return missing
    c = components["Evaluator"]
    d = c["details"]
    names = (components.get("Trainer", {}).get("details") or {}).get("class_names") or []
    threshold = evaluation_results.accuracy_threshold(c["outputs"]["evaluation"][0])
    reasons = []
    if d["accuracy"] is None:
        reasons.append("no accuracy was computed")
    elif threshold is not None:
        reasons.append(f"accuracy {d['accuracy']:.4f} {'≥' if d['accuracy'] >= threshold else '<'} "
                       f"threshold {threshold:.4f}")
    if d["baseline_accuracy"] is not None and d["accuracy"] is not None:
        reasons.append(f"{'not below' if d['accuracy'] >= d['baseline_accuracy'] else 'below'} the last blessed "
                       f"model's {d['baseline_accuracy']:.4f}")
    elif d.get("baseline_skipped"):
        reasons.append(f"not compared with the last blessed model: {d['baseline_skipped']}")
    elif d["baseline_accuracy"] is None:
        reasons.append("no blessed model to compare with yet")
    verdict = "BLESSED" if d["blessed"] else "NOT BLESSED"
    body = (f"<p><b>{verdict}</b>: {esc('; '.join(reasons))}."
            + (f" Failed checks: {esc('; '.join(d['failures']))}." if d["failures"] else "") + "</p>")
    pushed = (components.get("Pusher", {}).get("details") or {})
    if pushed:
        body += (f"<p>Pushed to <code>{esc(pushed['destination'])}</code>.</p>" if pushed["pushed"]
                 else "<p>Not pushed: the model was not blessed.</p>")
    body += table(["metric", "value"], [["accuracy", d["accuracy"]], ["eval examples", d["example_count"]],
                                         ["last blessed model's accuracy", d["baseline_accuracy"]]], numeric=[1])
    card = (components.get("ModelCard", {}).get("details") or {})
    if card.get("card_html"):
        body += f"<p>Model card: <a href=\"file://{esc(card['card_html'])}\">{esc(card['card_html'])}</a>.</p>"
    views = d.get("views")
    if views:
        body += _threshold_views(views, "eval")
    elif d.get("per_class"):
        body += "<h3>Per class</h3>" + table(
            ["class", "precision", "recall", "eval examples"],
            [[name, m["precision"], m["recall"], m["support"]] for name, m in sorted(d["per_class"].items())],
            numeric=[1, 2, 3])
    body += _confusion(names, d.get("confusion"))
    body += _misclassified(components)
    test = d.get("test")
    if test:
        body += (f"<h3 id=\"test\">Test split</h3><p>Scored apart (it blesses nothing): accuracy "
                 f"{esc(_fmt_or_dash(test['accuracy']))} on {test['example_count'] or 0:,} test examples.</p>")
        if test.get("views"):
            body += _threshold_views(test["views"], "test", curves=False)
        body += _confusion(names, test.get("confusion"))
    return _section("evaluation", "Evaluation", body)


def _fmt_or_dash(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _confusion(names, confusion) -> str:
    if not names or not confusion:
        return ""
    matrix = [[0] * len(names) for _ in names]
    for actual, predicted, count in confusion:
        if 0 <= actual < len(names) and 0 <= predicted < len(names):
            matrix[actual][predicted] += count
    order = sorted(range(len(names)), key=lambda i: names[i])
    matrix = [[matrix[i][j] for j in order] for i in order]
    return "<h3>Confusion matrix</h3>" + confusion_svg(matrix, [names[i] for i in order])


MAX_CURVES = 10  # per-class precision-recall curves drawn (the classes with the most examples)


def _threshold_views(views: Dict[str, Any], split: str, curves: bool = True) -> str:
    """AutoML's evaluation views (components/evaluation_views.py, computed by the Evaluator): per class at the
    chosen confidence threshold, how precision, recall and coverage move with it, precision-recall curves."""
    chosen, at = views["chosen"], views.get("at_threshold") or {}
    body = (f"<h3>Per class at confidence threshold {chosen['threshold']:g}</h3><p>Threshold: {esc(chosen['how'])}."
            f" Below it the model answers \"unsure\" (<code>imagepipe predict</code>); at it, on the {split} split: "
            f"precision {_fmt_or_dash(at.get('precision'))}, recall {_fmt_or_dash(at.get('recall'))}, coverage "
            f"{_fmt_or_dash(at.get('coverage'))} (the share of images given a class).</p>")
    body += table(["class", "precision", "recall", "F1", f"{split} examples", "predicted"],
                  [[name, m["precision"], m["recall"], m["f1"], m["support"], m["predicted"]]
                   for name, m in sorted(at.get("per_class", {}).items())], numeric=[1, 2, 3, 4, 5])
    if not curves:
        return body
    curve = views["curve"]
    moving = {name: [(p["threshold"], p[name]) for p in curve] for name in ("precision", "recall", "coverage")}
    overall = {"all classes": [(p["recall"], p["precision"]) for p in curve]}
    biggest = sorted(at.get("per_class", {}), key=lambda n: -at["per_class"][n]["support"])[:MAX_CURVES]
    per_class = {name: [(p["per_class"][name]["recall"], p["per_class"][name]["precision"]) for p in curve]
                 for name in biggest}
    body += ("<h3>Confidence threshold</h3><div class=\"grid\">"
             + xy_chart(moving, "as the threshold moves", "confidence threshold", "share",
                        marker_x=chosen["threshold"])
             + xy_chart(overall, "precision-recall, overall", "recall", "precision")
             + xy_chart(per_class, "precision-recall per class"
                        + (f" ({MAX_CURVES} largest)" if len(at.get("per_class", {})) > MAX_CURVES else ""),
                        "recall", "precision") + "</div>")
    body += table(["threshold", "precision", "recall", "coverage"],
                  [[p["threshold"], p["precision"], p["recall"], p["coverage"]] for p in curve[::4]],
                  numeric=[0, 1, 2, 3])
    return body


def _misclassified(components: Dict[str, Dict]) -> str:
    """The eval images the trained model gets wrong."""
    model_uri = (components.get("Trainer", {}).get("outputs", {}).get("model") or [None])[0]
    examples_uri = (components.get("ImageExampleGen", {}).get("outputs", {}).get("examples") or [None])[0]
    found = model_uri and examples_uri and report_data.misclassified(model_uri, examples_uri, MAX_EVAL_EXAMPLES,
                                                                     MAX_MISCLASSIFIED)
    if not found:
        return ""
    wrong, seen = found
    if not wrong:
        return f"<h3>Misclassified eval images</h3><p>None among the {seen:,} eval images checked.</p>"
    tiles_ = [{"src": thumbnail(w["image"]), "caption": f"{w['actual']} → {w['predicted']} ({w['probability']:.2f})"}
              for w in wrong]
    return (f"<h3>Misclassified eval images</h3><p class=\"muted\">true class → predicted (probability); "
            f"the first {len(wrong)} of the {seen:,} eval images checked.</p>" + tiles(tiles_))


# --- timings ------------------------------------------------------------------------------------


def _timings(summary: Dict[str, Any]) -> str:
    rows = []
    for c in summary["components"]:
        started = datetime.datetime.fromtimestamp(c["started_ms"] / 1000, datetime.timezone.utc)
        rows.append([c["component"], c["state"], f"{started:%H:%M:%S}", f"{c['seconds']:.1f}", c["execution_id"]])
    total = sum(c["seconds"] for c in summary["components"])
    body = table(["component", "state", "started (UTC)", "seconds", "MLMD execution id"], rows, numeric=[3, 4])
    body += (f"<p>{total:.1f} s in components. Pipeline run id <code>{esc(summary['run_id'])}</code> "
             f"(the <code>pipeline_run</code> context in {esc(summary['metadata_path'])}).</p>")
    return _section("timings", "Timings", body)
