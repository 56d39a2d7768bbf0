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

A failed run gets a report too: what completed, and the failing component with its error. The sections
are data_sections.py (data, validation, data health) and model_sections.py (tuning, training,
evaluation); report_data.py reads what they show from the run's artifacts, report_html.py draws it.
TFDV's Facets statistics view loads its code from the network, so the statistics here are
rendered from the same protos as plain tables.
"""

import datetime
import os
from typing import Any, Dict

from report import data_sections, model_sections
from report.report_html import GENERATOR, document, esc, section, table
from runs import verdicts
from storage import user_files
from storage.errors import ConfigError

# A report imagepipe wrote (its generator tag near the top; before the tag, its title): the only existing file
# `report --out` replaces.
REPORT_KIND = user_files.Kind(
    "a report",
    lambda head: (
        GENERATOR.encode() in head or (head.startswith(b"<!doctype html>") and b"<title>imagepipe run " in head)
    ),
)


def report_path(root: str, pipeline_name: str, run_id: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in run_id)
    return os.path.join(root, "reports", pipeline_name, f"{safe}.html")


def build(summary: Dict[str, Any], out_path: str, pipeline_name: str = "") -> str:
    """Writes the report of a run, as run_summary.summarize() describes it, to out_path; returns the path."""
    components = {c["component"]: c for c in summary["components"]}
    sections = [
        _verdict(summary),
        data_sections.data(components),
        data_sections.validation(components),
        data_sections.health(components),
        model_sections.tuning(components),
        model_sections.training(components),
        model_sections.evaluation(components),
        _timings(summary),
    ]
    started = datetime.datetime.fromtimestamp(summary["started_ms"] / 1000, datetime.timezone.utc)
    header = (
        f"<h1>{esc(pipeline_name or 'imagepipe')} — run {esc(summary['run_id'])}</h1>"
        f'<div class="meta">status: <b>{esc(summary["status"])}</b> · started '
        f"{started:%Y-%m-%d %H:%M:%S} UTC · ML Metadata {esc(summary['metadata_path'])}</div>"
    )
    text = document(f"imagepipe run {summary['run_id']}", header, "".join(s for s in sections if s))
    try:
        return user_files.write_whole(out_path, text.encode("utf-8"), "--out", REPORT_KIND)
    except ConfigError as e:
        raise ReportError(str(e)) from None


class ReportError(OSError):
    """The report cannot be written where asked; one line naming the path and the fix."""


def _verdict(summary: Dict[str, Any]) -> str:
    cards = []
    for title, verdict in (("Data", verdicts.data_verdict(summary)), ("Model", verdicts.model_verdict(summary))):
        if verdict:
            kind, text = verdict
            cards.append(f'<div class="card {kind}"><b>{title}</b><br>{esc(text)}</div>')
    failed = next((c for c in summary["components"] if c["state"] == "FAILED"), None)
    body = f'<div class="verdict">{"".join(cards)}</div>'
    if failed:
        body += (
            f"<h3>Failed at {esc(failed['component'])}</h3>"
            f'<div class="err">{esc(failed["error"] or "no error message recorded")}</div>'
        )
    elif summary["status"] == "running":
        body += '<p class="muted">The run has not finished: the report shows what has completed so far.</p>'
    elif summary["status"] == "interrupted":
        body += (
            "<h3>Interrupted</h3><p>The run was stopped (Ctrl-C, a signal, or a killed process) before it "
            "finished; below is what completed. The next run reuses it from the cache.</p>"
        )
    return section("summary", "Summary", body)


def _timings(summary: Dict[str, Any]) -> str:
    rows = []
    for c in summary["components"]:
        started = datetime.datetime.fromtimestamp(c["started_ms"] / 1000, datetime.timezone.utc)
        rows.append([c["component"], c["state"], f"{started:%H:%M:%S}", f"{c['seconds']:.1f}", c["execution_id"]])
    total = sum(c["seconds"] for c in summary["components"])
    body = table(["component", "state", "started (UTC)", "seconds", "MLMD execution id"], rows, numeric=[3, 4])
    body += (
        f"<p>{total:.1f} s in components. Pipeline run id <code>{esc(summary['run_id'])}</code> "
        f"(the <code>pipeline_run</code> context in {esc(summary['metadata_path'])}).</p>"
    )
    return section("timings", "Timings", body)
