"""`imagepipe run`: the pipeline on this machine (pipeline/local_runner.py), one run of a pipeline at a
time, Ctrl-C and SIGTERM recorded as an interruption, then the summary and the HTML report."""

import argparse
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
from pipeline.config import PipelineConfig, pipelines_in_root
from storage.errors import DataError
from storage.relocation import BaselineError


def print_summary(summary, config: Optional[PipelineConfig] = None) -> None:
    from runs import run_text, verdicts  # ML Metadata (~0.2 s): the CLI imports this module at start-up

    predict = review = None
    if config is not None:
        root = "" if config.root == PipelineConfig().root else f" --root {config.root}"
        name = f" --name {config.pipeline_name}" if len(pipelines_in_root(config.root)) > 1 else ""
        predict = f"imagepipe predict{root}{name} IMAGE..."
        review = f"imagepipe review{root}{name}"
    for line in run_text.format_summary(summary) + verdicts.hints(summary, predict, review):
        print(line)


def cmd_run(args: argparse.Namespace) -> int:
    """Parses and prints: the run, whole, is pipeline/local_runner.py's (run_local)."""
    quiet_logs(args.verbose)
    from pipeline import local_runner  # TFX and PIL: the CLI imports this module at start-up

    config = with_tuning(config_from_args(args), args, local=True)
    try:
        outcome = local_runner.run_local(config, args.progress, args.verbose)
    except DataError as e:
        return fail(EXIT_BAD_INPUT, str(e))
    return print_outcome(outcome, args.progress)


INTERRUPTED = "interrupted; the report shows what completed, and the next run reuses it from the cache"


def print_outcome(outcome, mode: str) -> int:
    """The run's end: its summary and report, or one line saying why it failed; the exit status."""
    summary, error, report, config = outcome.summary, outcome.error, outcome.report, outcome.config
    if mode == "json":
        outcome.printer.emit(
            {
                "event": "run_finished",
                "status": summary["status"] if summary else "failed",
                "run_id": summary["run_id"] if summary else None,
                "report": report,
                "error": (INTERRUPTED if outcome.interrupted else error_text(error, config.root)) if error else None,
                "components": summary["components"] if summary else [],
            }
        )
    elif summary:
        if mode == "human":
            print()
        print_summary(summary, config if not error else None)
        if report:
            print(f"report: {report}")
    if outcome.interrupted:
        return fail(EXIT_INTERRUPTED, INTERRUPTED + (f" (report: {report})" if report else ""))
    if error:
        return fail(EXIT_RUN_FAILED, error_text(error, config.root) + (f" (details: {report})" if report else ""))
    return 0


def error_text(error: Exception, root: str = "") -> str:
    # TensorFlow and TFX (~5 s): the CLI imports this module at start-up
    from components.example_gen.ingest_report import IngestionError
    from components.validation.gate import DataValidationError

    if isinstance(error, (IngestionError, DataValidationError, BaselineError)):
        return str(error)  # written for the user already
    text = str(error)
    if "[Errno 28]" in text or "No space left on device" in text:  # also inside a worker's or Beam's error
        return (
            f"no space left on the device while writing the run's outputs under --root {root or '(the root)'}; "
            "free space there or give a --root on a disk with room, then run again (finished steps are cached)"
        )
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
