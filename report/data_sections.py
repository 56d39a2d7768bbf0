"""The report's data sections: data (files, splits, classes, quarantine), validation (anomalies, schema,
statistics, drift) and data health (near-duplicates, likely label errors, outliers)."""

from typing import Any, Dict, List, Optional

from components import drift as drift_lib
from images.finding.listing import labels_of, split_sort_key
from report import report_data
from report.report_html import esc, histogram_svg, not_reached, section, share_bar, table, thumbnail, tiles, unfinished
from runs import run_text
from trainer import class_balance

MAX_QUARANTINE_ROWS = 200


MAX_THUMBNAILS = 48


def data(components: Dict[str, Dict]) -> str:
    missing = unfinished(components, "ImageExampleGen", "data", "Data", "Ingestion")
    if missing:
        return missing
    d = components["ImageExampleGen"]["details"]
    splits = sorted(d["examples_per_split"], key=split_sort_key)
    classes = sorted(d["label_map"], key=d["label_map"].get)
    body = _files_read(d)
    body += "<h3>Examples per split and class (the label map's ids)</h3>"
    body += _class_mix(d)
    body += _examples_table(d, splits, classes)
    if d["quarantined"]:
        body += "<h3>Quarantined files</h3>" + table(["reason", "files"], d["quarantine_reasons"].items(), numeric=[1])
        body += _quarantine_rows(d, components["ImageExampleGen"]["properties"].get("input_base", ""))
    if d.get("duplicate_groups"):
        body += (
            f"<h3>Duplicates</h3><p>{d['duplicate_files']} files in {d['duplicate_groups']} groups of "
            "identical content (kept in one split, or quarantined as shown above); for example:</p>"
        )
        body += table(["identical files"], [[", ".join(g)] for g in d["duplicate_examples"][:10]])
    if d.get("task") == "multi":
        body += _label_mix(d, classes)
    if d.get("classes_without_examples"):
        body += f'<p class="muted">Classes with no valid image: {esc(", ".join(d["classes_without_examples"]))}</p>'
    return section("data", "Data", body)


def _files_read(d: Dict) -> str:
    """What ingestion read and wrote, and the examples it downscaled."""
    body = (
        f"<p>{d['files_seen']:,} files read from <code>{esc(d['source'])}</code> ({esc(d['layout'])} layout): "
        f"{d['examples_written']:,} examples written, {d['quarantined']:,} quarantined, "
        f"{d['skipped_hidden']:,} hidden file{'' if d['skipped_hidden'] == 1 else 's'} skipped. Formats: "
        + ", ".join(f"{esc(k)} {v:,}" for k, v in d["formats"].items())
        + ".</p>"
    )
    if d.get("downscaled"):
        body += (
            f"<p>{d['downscaled']:,} of the examples hold a downscaled copy of their image (the files are "
            f"larger than {d['store_max_pixels']:,} pixels, <code>--store-max-pixels</code>); their "
            "original size and hash are in <code>image/original/height</code>, <code>image/original/width"
            "</code> and <code>image/key/sha256</code>.</p>"
        )
    return body


def _class_mix(d: Dict) -> str:
    """How balanced the classes are, and what training and the Evaluator do about an imbalance."""
    if d.get("imbalance_ratio") is None:
        return ""
    imbalanced = d["imbalance_ratio"] > class_balance.IMBALANCED_RATIO
    style = ' class="warn"' if imbalanced else ""
    return (
        f"<p{style}>Class mix: {esc(run_text.describe_balance(d))}"
        + (
            (
                "; training weighs the rare labels' positive examples and follows macro AUC-PR, and the "
                "Evaluator judges every label with enough eval images at its threshold"
                if d.get("task") == "multi"
                else "; training balances the classes and follows balanced accuracy, and the Evaluator judges "
                "every class with enough eval images"
            )
            + " (<code>--class-balance</code>, <code>--min-class-recall</code>)."
            if imbalanced
            else "."
        )
        + "</p>"
    )


def _examples_table(d: Dict, splits: List[str], classes: List[str]) -> str:
    """Examples per split and class, with each class's share of every split."""
    rows = [
        [name, d["label_map"][name]]
        + [d["examples_per_split_and_class"].get(s, {}).get(name, 0) for s in splits]
        + [sum(d["examples_per_split_and_class"].get(s, {}).get(name, 0) for s in splits)]
        for name in classes
    ]
    rows.append(["all classes", ""] + [d["examples_per_split"][s] for s in splits] + [d["examples_written"]])
    shares = {s: d["examples_per_split"][s] or 1 for s in splits}
    return table(
        ["class", "id"] + splits + ["total"] + [f"share of {s}" for s in splits],
        [
            row
            + (
                [share_bar(row[2 + i] / shares[s]) for i, s in enumerate(splits)]
                if row[0] != "all classes"
                else [""] * len(splits)
            )
            for row in rows
        ],
        numeric=range(1, len(splits) + 3),
        raw=range(len(splits) + 3, 2 * len(splits) + 3),
    )


def _label_mix(d: Dict, labels: List[str]) -> str:
    """A multi-label set: images without any label, the common label sets and which labels come together."""
    without = d.get("examples_without_labels") or {}
    body = (
        "<h3>Labels (multi-label: an image may have several, or none)</h3><p>The table above counts the images of "
        "each label (an image counts once for each of its labels). Images without any label: "
        + esc(", ".join(f"{s} {n:,}" for s, n in without.items()))
        + ".</p>"
    )
    sets = d.get("label_sets_in_train") or {}
    if sets:
        body += "<h4>Most common label sets in train</h4>" + table(
            ["labels", "images"],
            [
                [", ".join(labels_of(name)) or "(none)", n]
                for name, n in sorted(sets.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            numeric=[1],
        )
    pairs = d.get("label_cooccurrence_in_train") or {}
    if pairs:
        body += "<h4>Labels together in train (images with both)</h4>" + table(
            ["label"] + labels,
            [[a] + [pairs.get(a, {}).get(b, "") if a != b else "-" for b in labels] for a in labels],
            numeric=range(1, len(labels) + 1),
        )
    return body


def _quarantine_rows(details: Dict, input_base: str) -> str:
    shown, total, files = report_data.quarantine(details, input_base, MAX_QUARANTINE_ROWS)
    thumbs = []
    for row, data in files:
        src = thumbnail(data)  # None for a file that does not decode
        if src:
            thumbs.append({"src": src, "caption": f"{row['path']} ({row['reason']})"})
        if len(thumbs) == MAX_THUMBNAILS:
            break
    out = table(
        ["path", "reason", "detail", "label"], [[r["path"], r["reason"], r["detail"], r["label"]] for r in shown]
    )
    if total > len(shown):
        out += f'<p class="muted">… and {total - len(shown):,} more in {esc(details["quarantine_csv"])}</p>'
    if thumbs:
        out += "<h3>Quarantined files that still decode</h3>" + tiles(thumbs)
    return out


MAX_HEALTH_ROWS = 50  # of the suspects and outliers (health.json keeps 50; the CSV files keep all)


MAX_NEAR_DUPLICATE_GROUPS = 12


def health(components: Dict[str, Dict]) -> str:
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
        body += (
            "<p><b>The data health check stopped the run</b> (the Summary has its message; "
            "<code>--gate warn</code> makes it a warning).</p>"
        )
    body += _near_duplicates(ingest, tile)
    body += _review(ingest)
    if not health:
        return section("health", "Data health", body + not_reached("DataHealth"))
    d = health["details"]
    if not d:
        return section("health", "Data health", body + "<p>DataHealth did not complete (see Summary).</p>")
    body += _label_issues(d, tile)
    body += _outliers(d, tile)
    body += _feature_drift(d)
    if d.get("problems"):
        body += "<h3>Over the limits</h3>" + table(
            ["check", "finding", "option"], [[p["check"], p["text"], p["option"]] for p in d["problems"]]
        )
    if d.get("warnings"):
        body += "<h3>Warnings</h3>" + table(["check", "finding"], [[w["check"], w["text"]] for w in d["warnings"]])
    return section("health", "Data health", body)


def _review(ingest: Dict[str, Any]) -> str:
    """What the review file given with --review changed (imagepipe review), and the decisions not applied."""
    review = ingest.get("review")
    if not review:
        return ""
    body = f"<h3>Review decisions</h3><p>{esc(run_text.describe_review(review))}.</p>"
    if review["not_applied"]:
        body += table(
            ["path", "decision", "why not applied"],
            [
                [row["path"], f"{row['action']} {row['new_label']}".strip(), row["why"]]
                for row in review["not_applied"][:50]
            ],
        )
    return body


def _near_duplicates(ingest: Dict[str, Any], tile) -> str:
    """Near-duplicate groups found at ingestion, with their images."""
    body = "<h3>Near-duplicates</h3>"
    if ingest.get("near_duplicate_search", {}).get("where") == "off":
        body += "<p>Not searched (<code>--near-duplicates off</code>): eval copies of train images go unseen.</p>"
    elif not ingest.get("near_duplicate_groups"):
        body += (
            "<p>No near-duplicates: no two images are resized, recompressed or slightly cropped copies of "
            "each other.</p>"
            if ingest
            else not_reached("ImageExampleGen")
        )
    else:
        body += (
            f"<p>{esc(run_text.describe_near_duplicates(ingest))}; "
            f"{ingest['near_duplicate_within_class']:,} groups stay within a class. "
            + (
                f"Every group is in <code>{esc(ingest['near_duplicates_csv'])}</code>"
                if ingest.get("near_duplicates_csv")
                else "The ingestion failed before listing every group"
            )
            + (
                "; with <code>--near-duplicates drop</code> one copy of each group with one label is kept."
                if not ingest.get("near_duplicates_dropped")
                else "."
            )
            + "</p>"
        )
        for n, group in enumerate(ingest["near_duplicate_examples"][:MAX_NEAR_DUPLICATE_GROUPS], start=1):
            labels = {label for _, label, _ in group}
            kind = (
                "conflicting labels"
                if len(labels) > 1
                else "train and eval"
                if len({split for _, _, split in group}) > 1
                else "one split"
            )
            shown = [t for t in (tile(path, f"{path} ({label}, {split})") for path, label, split in group) if t]
            body += f"<h4>Group {n}: {esc(kind)}</h4>" + (
                tiles(shown) if shown else table(["path", "label", "split"], group)
            )
    return body


def _label_issues(d: Dict[str, Any], tile) -> str:
    """The label check's suspects, most likely first, with their images."""
    body = "<h3>Likely label errors</h3>"
    if d.get("label_issue_fraction") is None:
        body += (
            '<p class="muted">Labels were not checked'
            + (
                f": {esc(d['label_check_skipped'])}"
                if d.get("label_check_skipped")
                else " (the check runs with the transfer models' features, or with <code>--label-check on</code>)."
            )
            + "</p>"
        )
    elif not d["label_issues"]:
        body += (
            f"<p>None found among {d['examples']:,} examples ({esc(d.get('label_check_method', ''))}; "
            f"{esc(run_text.describe_label_model(d['label_check_accuracy'], d.get('label_check_method', '')))}).</p>"
        )
    else:
        body += (
            f"<p>{d['label_issues']:,} of {d['examples']:,} examples ({d['label_issue_fraction']:.1%}) look "
            f"mislabelled: their given label gets a low probability from a model that never saw them "
            f"({esc(d['label_check_method'])}, ranked by confident learning, most likely first; "
            f"{esc(run_text.describe_label_model(d['label_check_accuracy'], d.get('label_check_method', '')))}). Nothing "
            f"was relabelled or dropped; review <code>{esc(d['label_issues_csv'])}</code>.</p>"
        )
        rows = d["label_issue_examples"][:MAX_HEALTH_ROWS]
        shown = [
            t
            for t in (
                tile(r["path"], f"{r['given']} → {r['suggested']} ({float(r['given_probability']):.2f})") for r in rows
            )
            if t
        ]
        if shown:
            body += '<p class="muted">given label → suggested label (probability of the given one)</p>' + tiles(shown)
        body += table(
            ["rank", "path", "split", "given", "suggested", "probability of the given label"],
            [[r["rank"], r["path"], r["split"], r["given"], r["suggested"], r["given_probability"]] for r in rows],
        )
    return body


def _outliers(d: Dict[str, Any], tile) -> str:
    """Poor images and feature-space outliers."""
    body = "<h3>Outliers and poor images</h3>"
    if not d["outliers"]:
        body += "<p>None: no nearly blank, very dark or bright, extremely elongated or far-off image.</p>"
    else:
        rows = d["outlier_examples"][:MAX_HEALTH_ROWS]
        shown = [t for t in (tile(r["path"], f"{r['label']}: {r['reasons']}") for r in rows) if t]
        body += (
            f"<p>{d['outliers']:,} images; all are in <code>{esc(d['outliers_csv'])}</code>.</p>"
            + (tiles(shown) if shown else "")
            + table(
                ["path", "split", "label", "reasons"], [[r["path"], r["split"], r["label"], r["reasons"]] for r in rows]
            )
        )
    return body


def _feature_drift(d: Dict[str, Any]) -> str:
    """The features' shift from the last blessed model's data."""
    body = "<h3>Drift in feature space</h3>"
    if d.get("feature_drift") is not None:
        body += (
            f"<p>The backbone features of this data moved {d['feature_drift']:.3f} from the last blessed "
            f"model's (standardised mean shift; limit {d['limits']['max_feature_drift']:.3f}, "
            "<code>--max-feature-drift</code>).</p>"
        )
    else:
        body += (
            '<p class="muted">Not measured: '
            + esc(
                d.get("feature_drift_skipped")
                or "it needs a transfer model's features and a blessed model to compare with"
            )
            + ".</p>"
        )
    return body


def validation(components: Dict[str, Dict]) -> str:
    validator = components.get("ExampleValidator")
    if not validator:
        return section("validation", "Data validation", not_reached("ExampleValidator"))
    # TFDV's own anomaly and schema tables (TFDV, TensorFlow: ~5 s): only when the run validated its data
    from tensorflow_data_validation.utils import display_util

    body = ""
    anomalies_uri = (validator["outputs"].get("anomalies") or [None])[0]
    found = (validator["details"] or {}).get("anomalies", [])
    gate = components.get("DataValidationGate", {})
    if gate.get("state") == "FAILED":
        body += (
            "<p><b>The validation gate stopped the run</b> because of the anomalies or the drift below "
            "(the Summary has its message).</p>"
        )
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
    return section("validation", "Data validation", body)


def _drift(gate: Optional[Dict]) -> str:
    """The new data beside the latest blessed model's, per compared distribution (components/drift.py)."""
    result = ((gate or {}).get("details") or {}).get("drift")
    if not result:
        return ""
    out = "<h3>Drift from the last blessed model's data</h3>"
    if "skipped" in result:
        return out + f'<p class="muted">Not checked: {esc(result["skipped"])}.</p>'
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
        out += (
            f"<h3>{esc(check['feature'])}: {'DRIFTED' if check['drifted'] else 'ok'} "
            f"(L-infinity {check['distance']:.3f}, threshold {check['threshold']:.3f})</h3>"
        )
        out += table(
            [check["feature"], "last blessed model's data", "this run's data", "examples then", "now"],
            [
                [
                    k,
                    share_bar(before.get(k, 0.0), color="#888"),
                    share_bar(now.get(k, 0.0)),
                    check["reference"].get(k, 0),
                    check["current"].get(k, 0),
                ]
                for k in keys
            ],
            numeric=[3, 4],
            raw=[1, 2],
        )
    return out


def _statistics(component: Optional[Dict]) -> str:
    if not component or not component["outputs"].get("statistics"):
        return ""
    out = (
        "<h3>Statistics</h3><p class=\"muted\">From StatisticsGen's protos (TFDV's Facets view needs the "
        "network, so it is not embedded).</p>"
    )
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
                rows.append(
                    [name, "int/float", common.num_non_missing, common.num_missing, summary, histogram_svg(buckets)]
                )
            elif kind == "string_stats":
                s = feature.string_stats
                formats = next(
                    (c.rank_histogram for c in feature.custom_stats if c.name == "image_format_histogram"), None
                )
                if formats is not None:  # TFDV's image domain stats: the bytes are images
                    values = "images: " + ", ".join(f"{b.label} {b.sample_count:,.0f}" for b in formats.buckets)
                else:
                    values = f"{s.unique:,} unique; top: " + ", ".join(
                        f"{v.value[:24]} ({v.frequency:,.0f})" for v in s.top_values[:5]
                    )
                rows.append([name, "string", s.common_stats.num_non_missing, s.common_stats.num_missing, values, ""])
            elif kind == "bytes_stats":
                s = feature.bytes_stats
                rows.append(
                    [
                        name,
                        "bytes",
                        s.common_stats.num_non_missing,
                        s.common_stats.num_missing,
                        f"{s.unique:,} unique, {s.avg_num_bytes:,.0f} bytes on average",
                        "",
                    ]
                )
        out += f"<h3>{esc(split)}: {dataset.num_examples:,} examples</h3>" + table(
            ["feature", "type", "present", "missing", "values", "histogram"], rows, numeric=[2, 3], raw=[5]
        )
    return out
