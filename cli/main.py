"""imagepipe: the command line.

    imagepipe run                                  # the digits sample, made on first use
    imagepipe run --data ~/PetImages               # a folder of class subfolders
    imagepipe run --data labels.csv                # a path,label[,split] manifest
    imagepipe predict cat.jpg dog.png              # with the newest pushed model
    imagepipe compile --target vertex --project P --region R --pipeline-root gs://B/root \\
        --image URI --data gs://B/images --output pipeline.json
    imagepipe schedule --cron "0 3 * * 1" ... [--dry-run]
    imagepipe runs [--failed]                      # the history, from ML Metadata
    imagepipe report [RUN]                         # a run's HTML report
    imagepipe export --format onnx --out model.onnx  # the newest pushed model for another runtime
    imagepipe sample-data --out DIR
    imagepipe export-schema --out schemas/pets/schema.pbtxt

One module per group of commands (run.py, predict.py, export.py, cloud.py, history.py, data.py, review.py),
what they share in common.py, the parser in parser.py. Heavy imports (TFX, TensorFlow) happen inside the commands, so `--help` and argument errors
are instant. Errors are one line: what is wrong and what to do.
"""

import atexit
import os
import sys
import threading
from typing import List, Optional

from cli.cloud import cmd_compile, cmd_schedule, cmd_submit
from cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, fail
from cli.data import cmd_cache, cmd_sample_data
from cli.export import cmd_export
from cli.history import cmd_export_schema, cmd_report, cmd_runs
from cli.parser import build_parser
from cli.predict import cmd_predict
from cli.review import cmd_review
from cli.run import cmd_run
from pipeline.config import ConfigError


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        commands = {
            "run": cmd_run,
            "predict": cmd_predict,
            "sample-data": cmd_sample_data,
            "export-schema": cmd_export_schema,
            "compile": cmd_compile,
            "submit": cmd_submit,
            "schedule": cmd_schedule,
            "report": cmd_report,
            "runs": cmd_runs,
            "cache": cmd_cache,
            "export": cmd_export,
            "review": cmd_review,
        }
        return commands[args.command](args)
    except ConfigError as e:
        return fail(EXIT_BAD_INPUT, str(e))
    except KeyboardInterrupt:
        return fail(EXIT_INTERRUPTED, "interrupted")


def console_main() -> None:
    """The `imagepipe` console script (and `python -m cli`): main(), then exit_without_teardown."""
    exit_without_teardown(main())


def exit_without_teardown(code: int) -> None:
    """Exits with `code`, skipping the interpreter's teardown.

    Once TensorFlow, Beam and TFX are loaded, Python's own exit spends 2-3 s destroying their modules
    (measured after a run whose threads had all ended and whose exit handlers had run). Nothing of ours
    is left to write by then: the exit handlers run (logging's flush among them) and the output is
    flushed first, and a command that left a thread running exits the ordinary way."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()  # pylint: disable=protected-access - what Python's exit would run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
