"""Runs the pipeline on this machine: LocalDagRunner, SQLite ML Metadata, Beam DirectRunner.

    python -m pipeline.local_runner          # the digits sample, like `imagepipe run`
    IMAGEPIPE_DATA=~/PetImages IMAGEPIPE_EPOCHS=20 python -m pipeline.local_runner

This module owns a local run: pipeline/preflight.py's `prepare(config)` checks the settings (once), the input and
--root (a one-line DataError or ConfigError, with nothing written) and settles what the run will be (the model
--model auto chose, an earlier search's trials); `run_local(config, ...)` is the run as `imagepipe run` makes it,
whole (prepared, said, in its pipeline's turn, create_pipeline(config, platform.local(config)) watched: live
progress, Ctrl-C and SIGTERM recorded as an interruption, a failed run's summary of what completed; then its HTML
report). `imagepipe run` (cli/run.py) only parses and prints the outcome; `run(config)`, for scripts, tests and
bench/, is the same run, quiet, its error raised and its summary returned.
"""

import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, NamedTuple, Optional

from absl import logging

import stacks
from pipeline import platform
from pipeline.config import ConfigError, PipelineConfig
from pipeline.environment import from_environment
from pipeline.preflight import Prepared, prepare
from runs import progress, run_lock
from storage.errors import DataError
from trainer.hparams import describe_model


def run(config: PipelineConfig, progress_mode: str = "quiet") -> Dict[str, Any]:
    """The run `imagepipe run` makes (run_local: prepared, in its pipeline's turn, watched, its report written), for
    scripts, tests and bench/: quiet unless told, its error raised (a bad setting or input: its one-line
    ConfigError or DataError, before TFX is imported); returns {'run_id', 'components': [...]} (see run_summary)."""
    outcome = run_local(config, progress_mode)
    if outcome.error is not None:
        raise outcome.error
    return outcome.summary


def _run(config: PipelineConfig, started_ms: int) -> Dict[str, Any]:
    # TFX (~12 s): imported once prepare() has checked the settings and the input (a mistake is one line at once)
    from tfx import v1 as tfx
    from tfx.orchestration import metadata

    # TFX and ML Metadata, as above
    from pipeline.pipeline import create_pipeline
    from runs import run_store, run_summary

    if config.cpu_replicas > 1:  # before TensorFlow starts in this process (the components run in it)
        from trainer import strategy

        strategy.split_cpu(config.cpu_replicas)
    os.makedirs(os.path.dirname(config.metadata_path), exist_ok=True)
    tfx_pipeline = create_pipeline(
        config,
        platform.local(config),
        metadata_connection_config=metadata.sqlite_metadata_connection_config(config.metadata_path),
    )
    try:
        tfx.orchestration.LocalDagRunner().run(tfx_pipeline)
    except Exception as e:
        # TFX marks the execution FAILED but keeps no message: keep it for `imagepipe runs` and reports.
        # Not for an interruption that Beam wrapped in its own error (the caller records the run as
        # interrupted, the FAILED execution included).
        if not interrupted(e):
            try:
                run_store.record_failure(config.metadata_path, f"{type(e).__name__}: {e}", started_ms)
            except Exception:  # noqa: BLE001 - never hide the run's own error behind this one
                pass
        raise
    return run_summary.summarize(config.metadata_path)


class Outcome(NamedTuple):
    """How a watched run ended: its configuration as it ran, the summary of what completed (None when it failed before
    any component; never an older run's), its error, whether Ctrl-C or SIGTERM stopped it, the printer its progress
    went to and its HTML report (None when there is no summary or it could not be written)."""

    config: PipelineConfig
    summary: Optional[Dict[str, Any]]
    error: Optional[BaseException]
    interrupted: bool
    printer: Any  # runs.progress.Printer
    report: Optional[str] = None


def run_local(config: PipelineConfig, progress_mode: str = "human", verbose: bool = False) -> Outcome:
    """`imagepipe run`, whole: prepare() (a bad setting or input raises its one-line ConfigError or DataError, with
    nothing written), what the run reads and where it writes said, the run in its pipeline's turn (runs/run_lock.py:
    this run's progress and summary are its own, whatever else runs on the same root) with live progress, Ctrl-C and
    SIGTERM recorded as an interruption, then the HTML report of what completed. `verbose`: the run's error with its
    traceback on standard error, and a report that cannot be written raises (else a warning)."""
    prepared = prepare(config)
    said = _prepared_event(prepared)  # before the clock starts: its reads (the stack's versions) take a few ms
    printer = progress.Printer(progress_mode)
    printer.emit(said)
    try:
        with run_lock.hold(prepared.config.metadata_path, on_wait=printer.note):
            outcome = _run_watched(prepared.config, printer)
    except KeyboardInterrupt as e:  # Ctrl-C while waiting for the pipeline's turn: nothing ran
        outcome = Outcome(prepared.config, None, e, True, printer)
    if verbose and outcome.error and not outcome.interrupted:
        traceback.print_exception(outcome.error)  # before the report's own trouble, if any
    return outcome._replace(report=write_report(outcome, verbose))


def _prepared_event(prepared: Prepared) -> Dict[str, Any]:
    config, found = prepared
    return {
        "event": "run_prepared",
        "stack": stacks.describe(),
        "pipeline": config.pipeline_name,
        "source": found["source"],
        "sample": config.uses_sample_data,
        "files": found["files"],
        "classes": len(found["classes"]),
        "layout": found["layout"],
        "model": describe_model(config.model, config.weights, config.model_choice),
        "artifacts": config.pipeline_root,
        "metadata": config.metadata_path,
    }


_signalled = []  # the signals received during this run (Beam may wrap the KeyboardInterrupt they raise)


def _raise_interrupted(signum, frame):
    _signalled.append(signum)
    raise KeyboardInterrupt


def _run_watched(config: PipelineConfig, printer) -> Outcome:
    from runs import run_store, run_summary  # ML Metadata: imported once prepare() has checked the settings

    metadata_path = config.metadata_path
    error = summary = None
    started_ms = int(time.time() * 1000) - 1000
    handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    _signalled.clear()
    try:
        with progress.Progress(metadata_path, started_ms, printer):
            try:
                summary = _run(config, started_ms)
            except (KeyboardInterrupt, Exception) as e:  # the summary of what did complete goes with it
                error = e
            stopped = summary is None and (bool(_signalled) or isinstance(error, KeyboardInterrupt))
            if stopped:
                run_store.record_interruption(metadata_path, started_ms)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if error:
        try:
            this_run = run_store.newest_run_since(metadata_path, started_ms)
        except Exception:  # noqa: BLE001 - an unreadable store: the run's own error says more
            this_run = None
        summary = run_summary.summarize(metadata_path, this_run.name) if this_run else None
    return Outcome(config, summary, error, stopped, printer)


def write_report(outcome: Outcome, verbose: bool = False) -> Optional[str]:
    """The run's HTML report (best effort: a report must never hide the run's own outcome)."""
    if not outcome.summary:
        return None
    from report import report  # ML Metadata and PIL: only a run with a summary has a report

    config = outcome.config
    try:
        path = report.report_path(config.root, config.pipeline_name, outcome.summary["run_id"])
        return report.build(outcome.summary, path, pipeline_name=config.pipeline_name)
    except Exception as e:  # noqa: BLE001
        print(f"imagepipe: warning: the HTML report could not be written ({type(e).__name__}: {e})", file=sys.stderr)
        if verbose:
            raise
        return None


def interrupted(error: BaseException) -> bool:
    """Whether `error` is, or wraps, a KeyboardInterrupt (Ctrl-C or SIGTERM raise one; Beam re-raises it
    from a step as "RuntimeError: KeyboardInterrupt [while running ...]")."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt) or str(error).startswith("KeyboardInterrupt"):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def main() -> int:
    """`python -m pipeline.local_runner`: settings from IMAGEPIPE_* variables, as `imagepipe run` reads
    them (IMAGEPIPE_DATA, IMAGEPIPE_ROOT, ...; the digits sample by default); bad settings or data are
    one line and exit status 2, before anything is written."""
    from runs import run_text  # ML Metadata: not at this module's import, which comes before prepare()

    logging.set_verbosity(logging.INFO)
    try:
        summary = run(from_environment(PipelineConfig()))
    except (ConfigError, DataError) as e:
        print(f"local_runner: error: {e}", file=sys.stderr)
        return 2
    for line in run_text.format_summary(summary):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
