"""What every command shares: exit statuses, the configuration from defaults, environment and options, the
one-line failure, quiet logs."""

import argparse
import dataclasses
import logging as std_logging
import os
import sys
import warnings

import stacks
from pipeline.config import ConfigError, PipelineConfig, pipelines_in_root
from pipeline.environment import from_environment
from storage.errors import one_line

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports Ctrl-C


def config_from_args(args: argparse.Namespace, kind=PipelineConfig):
    """Defaults, then IMAGEPIPE_* variables, then the command line."""
    config = from_environment(kind())
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(kind) if getattr(args, f.name, None) is not None}
    return dataclasses.replace(config, **given)


def existing_pipeline(args: argparse.Namespace) -> PipelineConfig:
    """The configuration of a pipeline that ran under --root: --name, else the only one there."""
    config = config_from_args(args)
    if config.name:
        return config
    names = pipelines_in_root(config.root)
    if len(names) > 1:
        raise ConfigError(
            f"{len(names)} pipelines in {config.root} ({', '.join(names)}): give --name "
            "('imagepipe runs' lists each one's runs)"
        )
    return dataclasses.replace(config, name=names[0]) if names else config


def fail(code: int, message: str) -> int:
    print(f"imagepipe: error: {one_line(message)}", file=sys.stderr)
    return code


def quiet_logs(verbose: bool) -> None:
    if not verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # CUDA-not-found and oneDNN notices are noise here
        stacks.quiet_tensorflow_start()  # the same notices where TensorFlow ignores the variable
        warnings.filterwarnings("ignore")
        std_logging.getLogger().setLevel(std_logging.ERROR)
        # Beam logs a failing step's traceback (and the worker's inside it) before raising it; the
        # error is printed once, as one line, by the command.
        std_logging.getLogger("apache_beam").setLevel(std_logging.CRITICAL)
        from absl import logging  # absl (~15 ms): not at the CLI's start-up, which imports this module

        # We print the failure ourselves; TFX's "Execution N failed" log line is noise here.
        logging.set_verbosity(logging.FATAL)


def with_tuning(config: PipelineConfig, args: argparse.Namespace, local: bool) -> PipelineConfig:
    """A local run given --tune searches; a compiled job's runs search only when needed; --retune always."""
    if args.retune and args.tune_trials == 0:
        raise ConfigError(
            "--retune with --tune 0: --tune 0 turns the search off; give --tune N (trials), or leave "
            "--tune out to search again with the last search's count"
        )
    search = args.retune or (local and bool(args.tune_trials))
    return dataclasses.replace(config, tune_mode="search" if search else config.tune_mode)
