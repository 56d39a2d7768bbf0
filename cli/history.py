"""`imagepipe report | runs | export-schema`: what earlier runs recorded in ML Metadata."""

import argparse
import dataclasses
import datetime
import json

from cli.common import EXIT_BAD_INPUT, config_from_args, existing_pipeline, fail, quiet_logs
from pipeline.config import pipelines_in_root
from storage import user_files


def summary_of_run(args: argparse.Namespace):
    """(the config of the run's pipeline, run_summary.summarize of the newest run or of args.run); raises
    run_store.NoMetadata."""
    # ML Metadata (~0.2 s): not at the CLI's start-up, which imports this module
    from runs import run_store, run_summary

    config = config_from_args(args)
    if not config.name:  # the pipeline of the newest run (or of RUN) in --root
        config = dataclasses.replace(
            config,
            name=run_store.pipeline_of_run(
                config.root,
                {name: dataclasses.replace(config, name=name).metadata_path for name in pipelines_in_root(config.root)},
                args.run,
            ),
        )
    return config, run_summary.summarize(config.metadata_path, args.run)


def cmd_report(args: argparse.Namespace) -> int:
    quiet_logs(verbose=False)
    # ML Metadata and PIL (~0.3 s): not at the CLI's start-up, which imports this module
    from report import report
    from runs import run_store

    try:
        config, summary = summary_of_run(args)
    except run_store.NoMetadata as e:
        return fail(EXIT_BAD_INPUT, str(e))
    out = args.out or report.report_path(config.root, config.pipeline_name, summary["run_id"])
    try:
        print(report.build(summary, out, pipeline_name=config.pipeline_name))
    except report.ReportError as e:
        return fail(EXIT_BAD_INPUT, str(e))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    # ML Metadata (~0.2 s): not at the CLI's start-up, which imports this module
    from runs import run_store, run_summary

    config = config_from_args(args)
    quiet_logs(verbose=False)
    names = [config.pipeline_name] if config.name else pipelines_in_root(config.root) or [config.pipeline_name]
    runs = []
    try:
        for name in names:
            found = run_summary.list_runs(dataclasses.replace(config, name=name).metadata_path)
            runs += [{"pipeline": name, **r} for r in found]
    except run_store.NoMetadata as e:
        return fail(EXIT_BAD_INPUT, str(e))
    runs.sort(key=lambda r: r["started_ms"], reverse=True)
    if args.failed:
        runs = [r for r in runs if r["status"] == "failed"]
    if args.json:
        print(json.dumps(runs, default=str))
        return 0
    if not runs:
        print("no failed runs" if args.failed else "no runs")
        return 0
    width = max(len("pipeline"), *(len(r["pipeline"]) for r in runs))
    print(
        f"{'pipeline':<{width}} {'run':<28} {'started (UTC)':<20} {'seconds':>8}  {'status':<11} "
        f"{'components':<24} {'accuracy':>8}  blessed"
    )
    for r in runs:
        started = datetime.datetime.fromtimestamp(r["started_ms"] / 1000, datetime.timezone.utc)
        counts = {}
        for c in r["components"]:
            counts[c["state"]] = counts.get(c["state"], 0) + 1
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        accuracy = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "-"
        blessed = {True: "yes", False: "no", None: "-"}[r["blessed"]]
        print(
            f"{r['pipeline']:<{width}} {r['run_id']:<28} {started:%Y-%m-%d %H:%M:%S}  {r['seconds']:>8.1f}  "
            f"{r['status']:<11} {states:<24} {accuracy:>8}  {blessed}"
        )
        if r["status"] == "failed":
            print(f"    failed at {r['failed_component']}: {(r['error'] or 'no message').splitlines()[0][:160]}")
    return 0


def cmd_export_schema(args: argparse.Namespace) -> int:
    from runs import run_summary  # ML Metadata (~0.2 s): not at the CLI's start-up, which imports this module

    # Never over an existing file: even a schema this command wrote may have been curated since.
    schema_kind = user_files.Kind(
        "a schema",
        lambda head: not head,
        refusal="export-schema never replaces an existing "
        "file (a schema there may hold your curation); give a new path, or remove it first",
    )
    user_files.check_target(args.out, "--out", schema_kind)
    quiet_logs(verbose=False)
    config = existing_pipeline(args)
    try:
        summary = run_summary.summarize(config.metadata_path)
    except (LookupError, OSError):
        return fail(
            EXIT_BAD_INPUT,
            f"no run found under {config.root}; run 'imagepipe run' first (with the same --root and --name)",
        )
    schemas = [
        c["details"]["schema"]
        for c in summary["components"]
        if c["component"] == "SchemaGen" and c["details"].get("schema")
    ]
    if not schemas:
        return fail(
            EXIT_BAD_INPUT,
            "the last run used a curated schema (ImportSchemaGen), not SchemaGen; run without --schema to infer one",
        )
    with open(schemas[0], "rb") as f:
        user_files.write_whole(args.out, f.read(), "--out", schema_kind)
    print(f"wrote {args.out}: review it (domains, presence), commit it, then run with --schema {args.out}")
    return 0
