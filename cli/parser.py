"""The `imagepipe` argument parser: every command and option, with its help."""

import argparse
from typing import List

from cli.common import EXIT_BAD_INPUT
from cli.predict import PREDICT_SHOWN
from pipeline.cloud_config import FOR_DATAFLOW_PREDICTION, SCHEDULE_ONLY, CloudConfig
from pipeline.config import DECLARED, PipelineConfig
from pipeline.runtime_parameters import RUNTIME_PARAMETERS, needs
from runs.progress import MODES as PROGRESS_MODES
from settings import declared, help_text, kind, option
from storage.errors import one_line


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line that says where to look."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """Every setting of a run, each an option made from its declaration (pipeline/config.py), by group."""
    _add_declared_options(p, [f for f in declared(PipelineConfig) if f.name in PipelineConfig.__annotations__])
    for group, fields in DECLARED.items():
        _add_declared_options(p.add_argument_group(GROUP_TITLES.get(group, group)), fields)
    p.add_argument(
        "--retune",
        action="store_true",
        help="search again now, even if nothing changed (with the last search's N unless --tune gives one)",
    )
    p.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default=PROGRESS_MODES[0],
        help=f"live progress: human, json (one JSON object per line), quiet; default {PROGRESS_MODES[0]}",
    )
    p.add_argument("--verbose", action="store_true", help="show TFX and Beam logs")


CLOUD_GROUP = "production (each also reads IMAGEPIPE_<OPTION>, e.g. IMAGEPIPE_PROJECT)"
GROUP_TITLES = {
    "checks": "data checks: on anomalies, drift from the latest blessed model's data (L-infinity distance of "
    "shares; 1 turns a check off) or data health over a limit, the run stops (or warns, --gate warn)"
}


def _add_declared_options(group, fields) -> None:
    """One option a declared setting (settings.setting()), made from its declaration; none for flag=None."""
    for field in fields:
        if field.metadata["flag"] is None:
            continue
        flag, text = option(field), help_text(field)
        if field.type is bool:  # a switch away from the default
            action = "store_false" if field.default else "store_true"
            group.add_argument(flag, dest=field.name, action=action, default=None, help=text)
        elif field.type == List[str]:  # repeatable
            group.add_argument(flag, dest=field.name, action="append", help=text)
        else:
            group.add_argument(
                flag,
                dest=field.name,
                type=str if field.metadata["choices"] else kind(field),  # Optional[int]: int
                choices=field.metadata["choices"],
                metavar=field.metadata.get("metavar"),
                help=text,
            )


def _add_cloud_options(p: argparse.ArgumentParser, only=None) -> None:
    """The production settings (pipeline/cloud_config.py), each an option made from its declaration: all but the
    schedule's, or `only` these."""
    fields = [f for f in declared(CloudConfig) if (f.name in only if only else f.name not in SCHEDULE_ONLY)]
    _add_declared_options(p, fields)


def _add_param_option(p) -> None:
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a value for the compiled job's runtime parameter NAME, without recompiling (repeatable): "
        + ", ".join(RUNTIME_PARAMETERS)
        + f" ({', '.join(f'{n} with {needs(n)}' for n in RUNTIME_PARAMETERS if needs(n))})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="imagepipe", description="A TFX pipeline for image classification.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = commands.choices  # so an unknown option is reported by its command
    _add_run_options(commands.add_parser("run", help="run the pipeline locally (LocalDagRunner)"))
    sample = commands.add_parser("sample-data", help="write the digits sample as image files")
    sample.add_argument("--out", help="folder to write (default <root>/data/digits)")
    _add_cloud_commands(commands)
    _add_history_commands(commands)
    _add_predict_command(commands)
    _add_model_commands(commands)
    return parser


def _add_cloud_commands(commands) -> None:
    """compile, submit, schedule: the pipeline for Vertex AI or Kubeflow Pipelines."""
    compile_cmd = commands.add_parser("compile", help="compile for Vertex AI or Kubeflow Pipelines")
    _add_run_options(compile_cmd)
    _add_cloud_options(compile_cmd.add_argument_group(CLOUD_GROUP))
    compile_cmd.add_argument("--output", help="file to write (default <name>_pipeline.json, or .yaml for kubeflow)")
    submit = commands.add_parser("submit", help="compile and start one run on Vertex AI or Kubeflow")
    _add_run_options(submit)
    _add_cloud_options(submit.add_argument_group(CLOUD_GROUP))
    submit.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    _add_param_option(submit)
    schedule = commands.add_parser("schedule", help="compile and schedule recurring retraining")
    _add_run_options(schedule)
    _add_cloud_options(schedule.add_argument_group(CLOUD_GROUP))
    _add_cloud_options(schedule, only=SCHEDULE_ONLY)
    schedule.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    _add_param_option(schedule)


def _add_history_commands(commands) -> None:
    """report, review, runs: what runs did."""
    report = commands.add_parser("report", help="write a run's HTML report (default: the newest run)")
    report.add_argument("run", nargs="?", help="run id, as 'imagepipe runs' lists them")
    report.add_argument("--root", help="the run's --root")
    report.add_argument("--name", help="the run's --name (default: the pipeline of the newest run in --root)")
    report.add_argument("--out", help="HTML file to write (default <root>/reports/<name>/<run>.html)")
    reviewing = commands.add_parser("review", help="a local page to keep, relabel or exclude what a run flags")
    reviewing.add_argument("run", nargs="?", help="run id, as 'imagepipe runs' lists them (default: the newest)")
    reviewing.add_argument("--root", help="the run's --root")
    reviewing.add_argument("--name", help="the run's --name (default: the pipeline of the newest run in --root)")
    reviewing.add_argument(
        "--review-file",
        help="the CSV decisions are appended to (default "
        "<root>/review/<name>.csv); give it to `imagepipe run --review`",
    )
    reviewing.add_argument("--predictions", help="`imagepipe predict --output` results: their unsure images too")
    reviewing.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: any free one)")
    runs = commands.add_parser("runs", help="list the runs recorded in ML Metadata, newest first")
    runs.add_argument("--root", help="the runs' --root")
    runs.add_argument("--name", help="the runs' --name (default: every pipeline in --root)")
    runs.add_argument("--failed", action="store_true", help="only failed runs")
    runs.add_argument("--json", action="store_true", help="as JSON")


def _add_predict_command(commands) -> None:
    """predict: a trained model on image files, here or on Dataflow."""
    predict = commands.add_parser("predict", help="classify image files with a trained model")
    predict.add_argument(
        "images",
        nargs="+",
        metavar="INPUT",
        help="image files, folders (every image below, hidden files skipped), CSV manifests "
        "(their path column), local or gs://",
    )
    predict.add_argument(
        "--output",
        help="also write every result to this .jsonl or .csv file (the terminal "
        f"then shows the first {PREDICT_SHOWN} and a summary)",
    )
    predict.add_argument(
        "--model",
        dest="model_dir",
        help="a pushed model folder or SavedModel (default: the newest pushed model of --root/--name)",
    )
    predict.add_argument("--root", help="the run's --root (to find the pushed model)")
    predict.add_argument("--name", help="the run's --name (default: the only pipeline in --root)")
    predict.add_argument("--top", type=int, default=1, help="classes to show per image (default %(default)s)")
    predict.add_argument(
        "--confidence-threshold",
        type=float,
        help="answer 'unsure' when the best probability is "
        "at or below this (default: the threshold that came with the model, its threshold.json; else none)",
    )
    predict.add_argument(
        "--automl-output",
        help="also write the results in Vertex AutoML's batch prediction shape "
        "(JSON Lines: instance, prediction {ids, displayNames, confidences}) to this .jsonl file",
    )
    predict.add_argument(
        "--explain",
        metavar="DIR",
        help="also write, per image, where the model looked for its top "
        "class: DIR/NNNNN-<name>.png (the map over the image) and .npy (the map), and DIR/index.csv "
        "(integrated gradients on the exported model; DIR new, empty, or written by --explain before)",
    )
    predict.add_argument(
        "--workers",
        type=int,
        default=0,
        help="classify with Beam in this many local processes (RunInference; needs --output); default: in this process",
    )
    c = predict.add_argument_group("batch prediction on Dataflow (each also reads IMAGEPIPE_<OPTION>)")
    _add_cloud_options(c, only=FOR_DATAFLOW_PREDICTION)


def _add_model_commands(commands) -> None:
    """export, cache, export-schema: a pushed model, the features cache and the schema, for use elsewhere."""
    exporting = commands.add_parser("export", help="a pushed model for another runtime: ONNX or Core ML")
    exporting.add_argument(
        "--format", required=True, help="onnx (onnxruntime and others) or coreml (an .mlpackage for Apple's systems)"
    )
    exporting.add_argument("--out", required=True, help="the file to write (.onnx), or the package (.mlpackage)")
    exporting.add_argument(
        "--model",
        dest="model_dir",
        help="a pushed model folder or SavedModel (default: the newest pushed model of --root/--name)",
    )
    exporting.add_argument("--root", help="the run's --root (to find the pushed model)")
    exporting.add_argument("--name", help="the run's --name (default: the only pipeline in --root)")
    cache = commands.add_parser("cache", help="the backbone features cache under --root: list, bound or clear it")
    cache.add_argument("--root", help="the runs' --root")
    cache.add_argument(
        "--max-gb",
        type=float,
        help="remove the least recently used backbones' features until the cache holds at most this many GB",
    )
    cache.add_argument("--clear", action="store_true", help="remove every cached feature")
    export = commands.add_parser("export-schema", help="copy the schema SchemaGen inferred in the last run")
    export.add_argument("--root", help="the run's --root")
    export.add_argument("--name", help="the run's --name (default: the only pipeline in --root)")
    export.add_argument("--out", required=True, help="where to write schema.pbtxt, e.g. schemas/<dataset>/schema.pbtxt")
