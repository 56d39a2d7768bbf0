"""`imagepipe run`: the pipeline on this machine (pipeline/local_runner.py), one run of a pipeline at a
time, Ctrl-C and SIGTERM recorded as an interruption, then the summary and the HTML report."""

import argparse
import sys
import time
from typing import Optional

from cli.common import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    config_from_args,
    fail,
    quiet_logs,
    with_tuning,
)
from pipeline.config import PipelineConfig


def print_summary(summary, config: Optional[PipelineConfig] = None) -> None:
    from pipeline.config import pipelines_in_root
    from runs import run_text, verdicts

    predict = review = None
    if config is not None:
        root = "" if config.root == PipelineConfig().root else f" --root {config.root}"
        name = f" --name {config.pipeline_name}" if len(pipelines_in_root(config.root)) > 1 else ""
        predict = f"imagepipe predict{root}{name} IMAGE..."
        review = f"imagepipe review{root}{name}"
    for line in run_text.format_summary(summary) + verdicts.hints(summary, predict, review):
        print(line)


def cmd_run(args: argparse.Namespace) -> int:
    mode = args.progress
    quiet_logs(args.verbose)
    from pipeline import local_runner
    from storage.errors import DataError

    try:
        prepared = local_runner.prepare(with_tuning(config_from_args(args), args, local=True))
    except DataError as e:
        return fail(EXIT_BAD_INPUT, str(e))
    config, found = prepared
    if mode == "human":
        from trainer.hparams import describe_model

        sample = " (the digits sample)" if config.uses_sample_data else ""
        print(
            f"imagepipe: pipeline {config.pipeline_name!r} on {found['source']}{sample}: "
            f"{found['files']:,} files, {len(found['classes'])} classes, {found['layout']} layout"
        )
        print(f"  model:     {describe_model(config.model, config.weights, config.model_choice)}")
        print(f"  artifacts: {config.pipeline_root}\n  metadata:  {config.metadata_path}", flush=True)
    from runs import run_lock

    def waiting(message: str) -> None:
        print(f"imagepipe: {message}", file=sys.stderr if mode == "json" else sys.stdout, flush=True)

    # Runs of one pipeline take turns (runs/run_lock.py): this run's progress, summary and report
    # are its own, whatever else runs on the same root.
    with run_lock.hold(config.metadata_path, on_wait=waiting):
        return _run_locked(prepared, mode, args.verbose)


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run."""


_signalled = []  # the signals received during this run (Beam may wrap the KeyboardInterrupt they raise)


def _raise_interrupted(signum, frame):
    _signalled.append(signum)
    raise KeyboardInterrupt


def _run_locked(prepared, mode: str, verbose: bool) -> int:
    import signal

    from pipeline import local_runner
    from runs import progress, run_store, run_summary

    config = prepared.config
    error = summary = None
    started_ms = int(time.time() * 1000) - 1000
    handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    _signalled.clear()
    try:
        with progress.Progress(config.metadata_path, started_ms, mode) as live:
            try:
                summary = local_runner.run(prepared, started_ms=started_ms, locked=True)
            except (KeyboardInterrupt, Exception) as e:  # reported below, with the report of what did complete
                error = e
                if verbose and not _signalled:
                    import traceback

                    traceback.print_exc()
            if summary is None and (_signalled or isinstance(error, KeyboardInterrupt)):
                error = _Interrupted(
                    "interrupted; the report shows what completed, and the next run reuses it from the cache"
                )
                run_store.record_interruption(config.metadata_path, started_ms)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if error:
        try:
            this_run = run_store.newest_run_since(config.metadata_path, started_ms)
        except Exception:  # noqa: BLE001 - an unreadable store: the run's own error says more
            this_run = None
        # None when the run failed before any component (the error says why); never an older run.
        summary = run_summary.summarize(config.metadata_path, this_run.name) if this_run else None
    report = write_report(config, summary, verbose=verbose)
    if mode == "json":
        live.printer.emit(
            {
                "event": "run_finished",
                "status": summary["status"] if summary else "failed",
                "run_id": summary["run_id"] if summary else None,
                "report": report,
                "error": error_text(error, config.root) if error else None,
                "components": summary["components"] if summary else [],
            }
        )
    elif summary:
        if mode == "human":
            print()
        print_summary(summary, config if not error else None)
        if report:
            print(f"report: {report}")
    if isinstance(error, _Interrupted):
        return fail(EXIT_INTERRUPTED, str(error) + (f" (report: {report})" if report else ""))
    if error:
        return fail(EXIT_RUN_FAILED, error_text(error, config.root) + (f" (details: {report})" if report else ""))
    return 0


def error_text(error: Exception, root: str = "") -> str:
    from components.example_gen.ingest_report import IngestionError
    from components.validation.gate import DataValidationError
    from storage.relocation import BaselineError

    if isinstance(error, (IngestionError, DataValidationError, BaselineError)):
        return str(error)  # written for the user already
    text = str(error)
    if "[Errno 28]" in text or "No space left on device" in text:  # also inside a worker's or Beam's error
        return (
            f"no space left on the device while writing the run's outputs under --root {root or '(the root)'}; "
            "free space there or give a --root on a disk with room, then run again (finished steps are cached)"
        )
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def write_report(config: PipelineConfig, summary, verbose: bool = False) -> Optional[str]:
    """The run's HTML report (best effort: a report must never hide the run's own outcome)."""
    if not summary:
        return None
    from report import report

    try:
        return report.build(
            summary,
            report.report_path(config.root, config.pipeline_name, summary["run_id"]),
            pipeline_name=config.pipeline_name,
        )
    except Exception as e:  # noqa: BLE001
        print(f"imagepipe: warning: the HTML report could not be written ({type(e).__name__}: {e})", file=sys.stderr)
        if verbose:
            raise
        return None
