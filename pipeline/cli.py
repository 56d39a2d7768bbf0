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
    imagepipe sample-data --out DIR
    imagepipe export-schema --out schemas/pets/schema.pbtxt

Heavy imports (TFX, TensorFlow) happen inside the commands, so `--help` and
argument errors are instant. Errors are one line: what is wrong and what to do.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from typing import List, Optional

from components.image_example_gen.sources import LAYOUTS
from pipeline.config import (GATE_MODES, LABEL_CHECKS, NEAR_DUPLICATE_MODES, TARGETS, CloudConfig, ConfigError,
                             PipelineConfig, from_environment, runtime_values)
from pipeline.progress import MODES as PROGRESS_MODES
from trainer.hparams import AUGMENTATIONS, MODELS, TFLITE_KINDS

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports Ctrl-C
PREDICT_SHOWN = 10  # `imagepipe predict --output`: results shown on the terminal before the summary line


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line that says where to look."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    d = PipelineConfig()
    p.add_argument("--data", help="folder of class subfolders (optionally train/ eval/ inside) or a CSV "
                   "manifest with a path,label[,split] header; default: the digits sample")
    p.add_argument("--root", help=f"where artifacts and ML Metadata go (default {d.root})")
    p.add_argument("--name", help="pipeline name: its runs, models and metadata are kept apart (default: from "
                   "--data, e.g. petimages-3f2a9c; 'digits' for the sample)")
    p.add_argument("--layout", choices=LAYOUTS, help="input layout (default auto)")
    p.add_argument("--span-pattern", help="read the latest span below --data, e.g. 'span-{SPAN}'")
    p.add_argument("--span-window", type=int, help="with --span-pattern: read the latest span and the N-1 "
                   "spans before it (default 1)")
    p.add_argument("--eval-percent", type=int, help=f"eval share of unsplit data (default {d.eval_percent})")
    p.add_argument("--max-pixels", type=int, help=f"quarantine larger images (default {d.max_pixels:,})")
    p.add_argument("--store-max-pixels", type=int, help="store images above this many pixels as a downscaled "
                   f"copy (aspect kept; 0: store originals; default {d.store_max_pixels:,})")
    p.add_argument("--max-bad-fraction", type=float,
                   help=f"fail when more files than this are bad (default {d.max_bad_fraction})")
    p.add_argument("--drop-duplicates", action="store_true", default=None,
                   help="keep one copy of identical files (default: keep all, in one split)")
    p.add_argument("--near-duplicates", choices=NEAR_DUPLICATE_MODES, help="near-duplicate images (resized, "
                   "recompressed, slightly cropped copies): report them (default), or drop all but one copy of each "
                   "group with one label")
    p.add_argument("--compression-level", type=int, help="gzip level of the TFRecords (default 0: stored)")
    p.add_argument("--schema", help="curated schema.pbtxt for ImportSchemaGen (default: infer with SchemaGen; "
                   "the sample uses schemas/digits/schema.pbtxt)")
    p.add_argument("--gate", choices=GATE_MODES, help="on anomalies or drift: stop the run (default) or warn")
    drift = p.add_argument_group("drift from the latest blessed model's data (L-infinity distance of shares; "
                                 "1 turns a check off)")
    drift.add_argument("--max-class-drift", type=float, help=f"class mix (default {d.max_class_drift})")
    drift.add_argument("--max-size-drift", type=float, help="image width and height, in power-of-two bins "
                       f"(default {d.max_size_drift})")
    drift.add_argument("--max-format-drift", type=float, help=f"JPEG/PNG/GIF/BMP mix (default {d.max_format_drift})")
    drift.add_argument("--max-count-drop", type=float, help="largest accepted drop of the example count, as a "
                       f"fraction (default {d.max_count_drop})")
    health = p.add_argument_group("data health (each over its limit stops the run, or warns with --gate warn)")
    health.add_argument("--label-check", choices=LABEL_CHECKS, help="look for likely label errors: auto (default: "
                        "with the transfer models' features), on (also a k-fold cnn on pixels, ~one more training), off")
    health.add_argument("--max-eval-near-duplicates", type=float, help="largest share of eval examples with a "
                        f"near-duplicate in train (default {d.max_eval_near_duplicates}: no check)")
    health.add_argument("--max-label-issues", type=float, help="largest share of suspected label errors "
                        f"(default {d.max_label_issues}: no check)")
    health.add_argument("--max-feature-drift", type=float, help="largest shift of the backbone features from the "
                        f"last blessed model's data (default {d.max_feature_drift})")
    t = p.add_argument_group("training")
    t.add_argument("--model", choices=MODELS,
                   help="cnn (fast default) or a keras.applications backbone for transfer learning")
    t.add_argument("--image-size", type=int, help="side of the square model input (default: 32 for the "
                   "sample, 64 for cnn, 224 for the backbones)")
    t.add_argument("--epochs", type=int, help="the most training epochs: training stops earlier once the eval loss "
                   f"has not improved for --patience epochs, keeping the best epoch (default {d.epochs})")
    t.add_argument("--patience", type=int, help=f"epochs without a lower eval loss before training stops "
                   f"(default {d.patience})")
    t.add_argument("--fine-tune-epochs", type=int, help="backbones: then at most this many epochs with the top "
                   "layers unfrozen")
    t.add_argument("--batch-size", type=int, help=f"per replica (default {d.batch_size})")
    t.add_argument("--learning-rate", type=float, help=f"(default {d.learning_rate})")
    t.add_argument("--weights", help="backbones: 'imagenet' (downloaded), a weights file (local or gs://), or '' (random)")
    t.add_argument("--augment", help=f"training augmentation: any of {','.join(AUGMENTATIONS)}")
    t.add_argument("--tflite", help=f"also export TensorFlow Lite models for devices: any of {','.join(TFLITE_KINDS)} "
                   "(scored on the eval split next to the SavedModel)")
    t.add_argument("--seed", type=int, help=f"(default {d.seed})")
    t.add_argument("--nondeterministic", dest="deterministic", action="store_false", default=None,
                   help="allow nondeterministic TensorFlow ops (faster on some GPUs; by default the same data, "
                   "settings and seed give the same model)")
    t.add_argument("--warm-start", action="store_true", default=None,
                   help="start training from the latest blessed model (same classes and model)")
    t.add_argument("--confidence-threshold", type=float, help="the model answers 'unsure' below this top "
                   "probability (imagepipe predict; in the model card): the report shows precision, recall and "
                   "coverage at every threshold")
    t.add_argument("--target-precision", type=float, help="instead: the lowest confidence threshold at which the "
                   "eval split's precision reaches this")
    t.add_argument("--tune", type=int, metavar="N", help="search hyperparameters first (learning rate, dropout, head "
                   "width, batch size; KerasTuner, Bayesian) in N trials scored on the eval split; later runs of "
                   "the pipeline reuse the best values until the classes, the data or the settings change")
    t.add_argument("--retune", action="store_true", help="search again now, even if nothing changed (with the "
                   "last search's N unless --tune gives one)")
    t.add_argument("--accuracy-threshold", type=float,
                   help=f"bless the model at this eval accuracy (default {d.accuracy_threshold})")
    p.add_argument("--no-cache", dest="enable_cache", action="store_false", default=None,
                   help="re-run every component")
    p.add_argument("--beam-arg", dest="beam_args", action="append",
                   help="extra Beam pipeline argument (repeatable)")
    p.add_argument("--progress", choices=PROGRESS_MODES, default=PROGRESS_MODES[0],
                   help="live progress: human (default), json (one JSON object per line), quiet")
    p.add_argument("--verbose", action="store_true", help="show TFX and Beam logs")


def _add_cloud_options(p: argparse.ArgumentParser) -> None:
    d = CloudConfig()
    c = p.add_argument_group("production (each also reads IMAGEPIPE_<OPTION>, e.g. IMAGEPIPE_PROJECT)")
    c.add_argument("--target", choices=TARGETS, help="Vertex AI Pipelines (default) or Kubeflow "
                   "Pipelines v2")
    _add_gcp_options(c)
    c.add_argument("--k8s-service-account", help="Kubeflow: the Kubernetes service account of the run pods")
    c.add_argument("--api-endpoint", help="Vertex AI API endpoint (private endpoints)")
    c.add_argument("--kfp-host", help="Kubeflow Pipelines API URL (for --target kubeflow)")
    _add_dataflow_options(c, "run ExampleGen, StatisticsGen, Transform and the Evaluator on Dataflow")
    c.add_argument("--vertex-training", action="store_true", default=None,
                   help="run the Trainer as a Vertex AI Training job")
    c.add_argument("--training-machine-type", help=f"(default {d.training_machine_type})")
    c.add_argument("--training-accelerator", help="e.g. NVIDIA_TESLA_T4, NVIDIA_L4")
    c.add_argument("--training-accelerator-count", type=int, help="(default 1)")
    c.add_argument("--training-tpu", help="a TPU type for the Trainer instead, e.g. TPU_V3 (8 cores)")
    c.add_argument("--endpoint", help="deploy blessed models to this Vertex AI endpoint (display name)")
    c.add_argument("--parallel-trials", type=int, help="with --tune and --vertex-training: trials at once, a "
                   "training machine each (TFX's Vertex Tuner; default 1)")


def _add_gcp_options(c) -> None:
    d = CloudConfig()
    c.add_argument("--project", help="GCP project")
    c.add_argument("--region", help=f"GCP region (default {d.region})")
    c.add_argument("--pipeline-root", help="gs://BUCKET/PATH for the runs' artifacts")
    c.add_argument("--image", help="the pipeline image (built from kubeflow/Dockerfile)")
    c.add_argument("--service-account", help="the GCP service account (email) Vertex runs and Dataflow workers execute as")


def _add_dataflow_options(c, what: str) -> None:
    d = CloudConfig()
    c.add_argument("--dataflow", action="store_true", default=None, help=what)
    c.add_argument("--dataflow-max-workers", type=int, help=f"(default {d.dataflow_max_workers})")
    c.add_argument("--dataflow-machine-type", help=f"(default {d.dataflow_machine_type})")
    c.add_argument("--dataflow-temp-location", help="gs:// (default <pipeline-root>/<name>/tmp)")


def _add_param_option(p) -> None:
    from pipeline.config import RUNTIME_PARAMETERS

    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a value for the compiled job's runtime parameter NAME, without recompiling (repeatable): "
                        + ", ".join(RUNTIME_PARAMETERS) + " (tune_trials with --tune, span_window with --span-pattern)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="imagepipe", description="A TFX pipeline for image classification.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = commands.choices  # so an unknown option is reported by its command
    _add_run_options(commands.add_parser("run", help="run the pipeline locally (LocalDagRunner)"))
    sample = commands.add_parser("sample-data", help="write the digits sample as image files")
    sample.add_argument("--out", help="folder to write (default <root>/data/digits)")
    compile_cmd = commands.add_parser("compile", help="compile for Vertex AI or Kubeflow Pipelines")
    _add_run_options(compile_cmd)
    _add_cloud_options(compile_cmd)
    compile_cmd.add_argument("--output", help="file to write (default <name>_pipeline.json, or .yaml for "
                             "kubeflow)")
    submit = commands.add_parser("submit", help="compile and start one run on Vertex AI or Kubeflow")
    _add_run_options(submit)
    _add_cloud_options(submit)
    submit.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    _add_param_option(submit)
    schedule = commands.add_parser("schedule", help="compile and schedule recurring retraining")
    _add_run_options(schedule)
    _add_cloud_options(schedule)
    schedule.add_argument("--cron", help="standard 5-field cron, UTC, e.g. '0 3 * * 1' (Mondays 03:00)")
    schedule.add_argument("--schedule-name", help="(default <name>-retraining)")
    schedule.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    _add_param_option(schedule)
    report = commands.add_parser("report", help="write a run's HTML report (default: the newest run)")
    report.add_argument("run", nargs="?", help="run id, as 'imagepipe runs' lists them")
    report.add_argument("--root", help="the run's --root")
    report.add_argument("--name", help="the run's --name (default: the pipeline of the newest run in --root)")
    report.add_argument("--out", help="HTML file to write (default <root>/reports/<name>/<run>.html)")
    runs = commands.add_parser("runs", help="list the runs recorded in ML Metadata, newest first")
    runs.add_argument("--root", help="the runs' --root")
    runs.add_argument("--name", help="the runs' --name (default: every pipeline in --root)")
    runs.add_argument("--failed", action="store_true", help="only failed runs")
    runs.add_argument("--json", action="store_true", help="as JSON")
    predict = commands.add_parser("predict", help="classify image files with a trained model")
    predict.add_argument("images", nargs="+", metavar="INPUT",
                         help="image files, folders (every image below, hidden files skipped), CSV manifests "
                              "(their path column), local or gs://")
    predict.add_argument("--output", help="also write every result to this .jsonl or .csv file (the terminal "
                         f"then shows the first {PREDICT_SHOWN} and a summary)")
    predict.add_argument("--model", dest="model_dir", help="a pushed model folder or SavedModel (default: the newest pushed model "
                         "of --root/--name)")
    predict.add_argument("--root", help="the run's --root (to find the pushed model)")
    predict.add_argument("--name", help="the run's --name (default: the only pipeline in --root)")
    predict.add_argument("--top", type=int, default=1, help="classes to show per image (default 1)")
    predict.add_argument("--confidence-threshold", type=float, help="answer 'unsure' when the best probability is "
                         "below this (default: the threshold that came with the model, its threshold.json; else none)")
    predict.add_argument("--automl-output", help="also write the results in Vertex AutoML's batch prediction shape "
                         "(JSON Lines: instance, prediction {ids, displayNames, confidences}) to this .jsonl file")
    predict.add_argument("--workers", type=int, default=0,
                         help="classify with Beam in this many local processes (RunInference; needs --output); "
                              "default: in this process")
    c = predict.add_argument_group("batch prediction on Dataflow (each also reads IMAGEPIPE_<OPTION>)")
    _add_gcp_options(c)
    _add_dataflow_options(c, "classify on Dataflow workers that run the pipeline image (gs:// --model, "
                             "--output and inputs)")
    cache = commands.add_parser("cache", help="the backbone features cache under --root: list, bound or clear it")
    cache.add_argument("--root", help="the runs' --root")
    cache.add_argument("--max-gb", type=float, help="remove the least recently used backbones' features until the "
                       "cache holds at most this many GB")
    cache.add_argument("--clear", action="store_true", help="remove every cached feature")
    export = commands.add_parser("export-schema", help="copy the schema SchemaGen inferred in the last run")
    export.add_argument("--root", help="the run's --root")
    export.add_argument("--name", help="the run's --name (default: the only pipeline in --root)")
    export.add_argument("--out", required=True, help="where to write schema.pbtxt, e.g. schemas/<dataset>/schema.pbtxt")
    return parser


def config_from_args(args: argparse.Namespace, kind=PipelineConfig):
    """Defaults, then IMAGEPIPE_* variables, then the command line."""
    config = from_environment(kind())
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(kind)
             if getattr(args, f.name, None) is not None}
    return dataclasses.replace(config, **given)


def existing_pipeline(args: argparse.Namespace) -> PipelineConfig:
    """The configuration of a pipeline that ran under --root: --name, else the only one there."""
    from pipeline.config import pipelines_in_root

    config = config_from_args(args)
    if config.name:
        return config
    names = pipelines_in_root(config.root)
    if len(names) > 1:
        raise ConfigError(f"{len(names)} pipelines in {config.root} ({', '.join(names)}): give --name "
                          "('imagepipe runs' lists each one's runs)")
    return dataclasses.replace(config, name=names[0]) if names else config


def _cloud_settings(args: argparse.Namespace, need_host: bool = False):
    config = _tuning(config_from_args(args), args, local=False).validate()
    cloud = config_from_args(args, CloudConfig).validate(config, need_host=need_host)
    return config, cloud


def cmd_compile(args: argparse.Namespace) -> int:
    config, cloud = _cloud_settings(args)
    _quiet_logs(args.verbose)
    from kubeflow import deploy

    output = deploy.compile_pipeline(config, cloud, args.output or deploy.default_output(config, cloud))
    kind = "PipelineJob for Vertex AI" if cloud.target == "vertex" else "PipelineSpec package for kfp.Client"
    print(f"wrote {output}: {kind}, image {cloud.image}, pipeline root {cloud.full_pipeline_root(config.pipeline_name)}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    config, cloud = _cloud_settings(args, need_host=True)
    _quiet_logs(args.verbose)
    from kubeflow import deploy

    request = deploy.submit(config, cloud, dry_run=args.dry_run, parameters=runtime_values(config, args.param))
    print(("would submit (dry run, nothing sent):" if args.dry_run else "submitted:"))
    print("\n".join(deploy.describe_lines(request)))
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    config, cloud = _cloud_settings(args, need_host=True)
    if not cloud.cron:
        raise ConfigError("no schedule: give --cron '0 3 * * 1' (minute hour day-of-month month day-of-week)")
    _quiet_logs(args.verbose)
    from kubeflow import deploy

    try:
        request = deploy.schedule(config, cloud, dry_run=args.dry_run, parameters=runtime_values(config, args.param))
    except deploy.ScheduleExists as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    print(("would schedule (dry run, nothing sent):" if args.dry_run else "scheduled:"))
    print("\n".join(deploy.describe_lines(request)))
    return 0


def _quiet_logs(verbose: bool) -> None:
    if not verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # CUDA-not-found and oneDNN notices are noise here
        warnings.filterwarnings("ignore")
        import logging as std_logging

        std_logging.getLogger().setLevel(std_logging.ERROR)
        # Beam logs a failing step's traceback (and the worker's inside it) before raising it; the
        # error is printed once, as one line, by the command.
        std_logging.getLogger("apache_beam").setLevel(std_logging.CRITICAL)
        from absl import logging

        # We print the failure ourselves; TFX's "Execution N failed" log line is noise here.
        logging.set_verbosity(logging.FATAL)


def _print_summary(summary, config: Optional[PipelineConfig] = None) -> None:
    from pipeline import run_text
    from pipeline.config import pipelines_in_root

    predict = None
    if config is not None:
        root = "" if config.root == PipelineConfig().root else f" --root {config.root}"
        name = f" --name {config.pipeline_name}" if len(pipelines_in_root(config.root)) > 1 else ""
        predict = f"imagepipe predict{root}{name} IMAGE..."
    for line in run_text.format_summary(summary) + run_text.hints(summary, predict):
        print(line)


def _tuning(config: PipelineConfig, args: argparse.Namespace, local: bool) -> PipelineConfig:
    """A local run given --tune searches; a compiled job's runs search only when needed; --retune always."""
    search = args.retune or (local and bool(args.tune))
    return dataclasses.replace(config, tune_mode="search" if search else config.tune_mode)


def cmd_run(args: argparse.Namespace) -> int:
    config = _tuning(config_from_args(args), args, local=True).validate()
    mode = args.progress
    _quiet_logs(args.verbose)
    from components.image_example_gen.sources import DataError
    from pipeline import local_runner

    try:
        found = local_runner.prepare(config)
    except DataError as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    config = local_runner.with_earlier_search(config)  # tuned before: the Tuner step again (reusing, or searching)
    if mode == "human":
        sample = " (the digits sample)" if config.uses_sample_data else ""
        print(f"imagepipe: pipeline {config.pipeline_name!r} on {found['source']}{sample}: "
              f"{found['files']:,} files, {len(found['classes'])} classes, {found['layout']} layout")
        print(f"  artifacts: {config.pipeline_root}\n  metadata:  {config.metadata_path}", flush=True)
    from pipeline import run_lock

    def waiting(message: str) -> None:
        print(f"imagepipe: {message}", file=sys.stderr if mode == "json" else sys.stdout, flush=True)

    # Runs of one pipeline take turns (pipeline/run_lock.py): this run's progress, summary and report
    # are its own, whatever else runs on the same root.
    with run_lock.hold(config.metadata_path, on_wait=waiting):
        return _run_locked(config, found, mode, args.verbose)


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run."""


_signalled = []  # the signals received during this run (Beam may wrap the KeyboardInterrupt they raise)


def _raise_interrupted(signum, frame):
    _signalled.append(signum)
    raise KeyboardInterrupt


def _run_locked(config: PipelineConfig, found, mode: str, verbose: bool) -> int:
    import signal

    from pipeline import local_runner, progress, run_store, run_summary

    error = summary = None
    started_ms = int(time.time() * 1000) - 1000
    handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    _signalled.clear()
    try:
        with progress.Progress(config.metadata_path, started_ms, mode) as live:
            try:
                summary = local_runner.run(config, prepared=found, started_ms=started_ms, locked=True)
            except (KeyboardInterrupt, Exception) as e:  # reported below, with the report of what did complete
                error = e
                if verbose and not _signalled:
                    import traceback

                    traceback.print_exc()
            if summary is None and (_signalled or isinstance(error, KeyboardInterrupt)):
                error = _Interrupted("interrupted; the report shows what completed, and the next run "
                                     "reuses it from the cache")
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
    report = _write_report(config, summary, verbose=verbose)
    if mode == "json":
        live.printer.emit({"event": "run_finished", "status": summary["status"] if summary else "failed",
                           "run_id": summary["run_id"] if summary else None, "report": report,
                           "error": _error_text(error, config.root) if error else None,
                           "components": summary["components"] if summary else []})
    elif summary:
        if mode == "human":
            print()
        _print_summary(summary, config if not error else None)
        if report:
            print(f"report: {report}")
    if isinstance(error, _Interrupted):
        return _fail(EXIT_INTERRUPTED, str(error) + (f" (report: {report})" if report else ""))
    if error:
        return _fail(EXIT_RUN_FAILED, _error_text(error, config.root) + (f" (details: {report})" if report else ""))
    return 0


def _error_text(error: Exception, root: str = "") -> str:
    from components.baseline import BaselineError
    from components.image_example_gen.ingest_report import IngestionError
    from components.validation_gate import DataValidationError

    if isinstance(error, (IngestionError, DataValidationError, BaselineError)):
        return str(error)  # written for the user already
    text = str(error)
    if "[Errno 28]" in text or "No space left on device" in text:  # also inside a worker's or Beam's error
        return (f"no space left on the device while writing the run's outputs under --root {root or '(the root)'}; "
                "free space there or give a --root on a disk with room, then run again (finished steps are cached)")
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _write_report(config: PipelineConfig, summary, verbose: bool = False) -> Optional[str]:
    """The run's HTML report (best effort: a report must never hide the run's own outcome)."""
    if not summary:
        return None
    from pipeline import report

    try:
        return report.build(summary, report.report_path(config.root, config.pipeline_name, summary["run_id"]),
                            pipeline_name=config.pipeline_name)
    except Exception as e:  # noqa: BLE001
        print(f"imagepipe: warning: the HTML report could not be written ({type(e).__name__}: {e})",
              file=sys.stderr)
        if verbose:
            raise
        return None


def cmd_report(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    _quiet_logs(verbose=False)
    from pipeline import report, run_store, run_summary

    try:
        if not config.name:  # the pipeline of the newest run (or of RUN) in --root
            config = dataclasses.replace(config, name=run_store.pipeline_of_run(config.root, args.run))
        summary = run_summary.summarize(config.metadata_path, args.run)
    except run_store.NoMetadata as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    out = args.out or report.report_path(config.root, config.pipeline_name, summary["run_id"])
    try:
        print(report.build(summary, out, pipeline_name=config.pipeline_name))
    except report.ReportError as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    import datetime

    from pipeline import run_store, run_summary
    from pipeline.config import pipelines_in_root

    config = config_from_args(args)
    _quiet_logs(verbose=False)
    names = [config.pipeline_name] if config.name else pipelines_in_root(config.root) or [config.pipeline_name]
    runs = []
    try:
        for name in names:
            found = run_summary.list_runs(dataclasses.replace(config, name=name).metadata_path)
            runs += [{"pipeline": name, **r} for r in found]
    except run_store.NoMetadata as e:
        return _fail(EXIT_BAD_INPUT, str(e))
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
    print(f"{'pipeline':<{width}} {'run':<28} {'started (UTC)':<20} {'seconds':>8}  {'status':<11} "
          f"{'components':<24} {'accuracy':>8}  blessed")
    for r in runs:
        started = datetime.datetime.fromtimestamp(r["started_ms"] / 1000, datetime.timezone.utc)
        counts = {}
        for c in r["components"]:
            counts[c["state"]] = counts.get(c["state"], 0) + 1
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        accuracy = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "-"
        blessed = {True: "yes", False: "no", None: "-"}[r["blessed"]]
        print(f"{r['pipeline']:<{width}} {r['run_id']:<28} {started:%Y-%m-%d %H:%M:%S}  {r['seconds']:>8.1f}  "
              f"{r['status']:<11} {states:<24} {accuracy:>8}  {blessed}")
        if r["status"] == "failed":
            print(f"    failed at {r['failed_component']}: {(r['error'] or 'no message').splitlines()[0][:160]}")
    return 0


def _fail(code: int, message: str) -> int:
    print(f"imagepipe: error: {message}", file=sys.stderr)
    return code


def cmd_sample_data(args: argparse.Namespace) -> int:
    from pipeline.sample_data import make_digits

    out = os.path.abspath(args.out or from_environment(PipelineConfig()).sample_data_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out}: not a folder; give a folder to write the images into")
    try:
        info = make_digits(out)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write the images there ({e.strerror or e}); give a folder you "
                          "can write to, on a disk with room") from None
    print(f"{info['files']:,} images in {info['classes']} classes at {info['path']}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    import datetime

    from components.backbone_features import feature_cache

    config = config_from_args(args)
    if args.max_gb is not None and args.max_gb < 0:
        raise ConfigError(f"--max-gb {args.max_gb}: give a size in GB (0 or more)")
    limit = 0 if args.clear else None if args.max_gb is None else int(args.max_gb * 2**30)
    if limit is not None:
        removed = feature_cache.prune(config.feature_cache, limit)
        freed = sum(d["bytes"] for d in removed)
        print(f"removed {len(removed)} backbone cache{'s' if len(removed) != 1 else ''}, {freed / 2**30:.2f} GB")
    found = feature_cache.describe(config.feature_cache)
    if not found:
        print(f"no cached features in {config.feature_cache}")
        return 0
    print(f"{'backbone':<16} {'size':>5} {'features':>10} {'GB':>7}  {'last used (UTC)':<20} fingerprint")
    for d in sorted(found, key=lambda d: d["last_used"], reverse=True):
        used = datetime.datetime.fromtimestamp(d["last_used"], datetime.timezone.utc)
        print(f"{d['model'] or '?':<16} {d['image_size'] or '?':>5} {d['entries']:>10,} {d['bytes'] / 2**30:>7.2f}  "
              f"{used:%Y-%m-%d %H:%M:%S}  {d['fingerprint']}")
    print(f"in {config.feature_cache}")
    return 0


def cmd_export_schema(args: argparse.Namespace) -> int:
    from pipeline import run_summary, user_files

    user_files.check_target(args.out, "--out")
    _quiet_logs(verbose=False)
    config = existing_pipeline(args)
    try:
        summary = run_summary.summarize(config.metadata_path)
    except (LookupError, OSError):
        return _fail(EXIT_BAD_INPUT, f"no run found under {config.root}; run 'imagepipe run' first "
                                     "(with the same --root and --name)")
    schemas = [c["details"]["schema"] for c in summary["components"]
               if c["component"] == "SchemaGen" and c["details"].get("schema")]
    if not schemas:
        return _fail(EXIT_BAD_INPUT, "the last run used a curated schema (ImportSchemaGen), not SchemaGen; "
                                     "run without --schema to infer one")
    with open(schemas[0], "rb") as f:
        user_files.write_whole(args.out, f.read(), "--out")
    print(f"wrote {args.out}: review it (domains, presence), commit it, then run with --schema {args.out}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from pipeline import predict, user_files

    # An explicit --model needs no pipeline (existing_pipeline asks for --name when the root has several).
    config = config_from_args(args) if args.model_dir else existing_pipeline(args)
    model = args.model_dir or config.serving_dir
    top = args.top
    if top < 1:
        raise ConfigError(f"--top {top}: give the number of classes to show per image (1 or more)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.workers > cores:
        raise ConfigError(f"--workers {args.workers}: this machine has {cores} cores, and each worker loads TensorFlow "
                          f"and the model (~0.7 GB); use at most {cores}, or --dataflow for more machines")
    if args.confidence_threshold is not None and not 0 <= args.confidence_threshold < 1:
        raise ConfigError(f"--confidence-threshold {args.confidence_threshold}: use a fraction from 0 to below 1")
    try:
        for option, path in (("--output", args.output), ("--automl-output", args.automl_output)):
            if path:  # before the model loads: a bad output file is one line at once
                predict.output_kind(path, option)
                user_files.check_target(path, option)
        model_dir = predict.resolve_model_dir(model)
        threshold, how = ((args.confidence_threshold, "--confidence-threshold")
                          if args.confidence_threshold is not None else predict.model_threshold(model_dir))
        if args.workers < 0:
            raise predict.InputError(f"--workers {args.workers}: give a number of processes (1 or more)")
        if args.workers or args.dataflow:
            return _predict_with_beam(args, config, model_dir, top, threshold)
        writer = predict.ResultWriter(args.output, top) if args.output else None
        automl = predict.ResultWriter(args.automl_output, top, automl_threshold=threshold) if args.automl_output \
            else None
    except (predict.ModelNotFound, predict.ModelUnusable, predict.InputError) as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    writers = [w for w in (writer, automl) if w]
    if threshold:
        print(f"confidence threshold {threshold:g} ({how}): below it an image is 'unsure'", file=sys.stderr)
    _quiet_logs(verbose=False)
    show = predict.printable  # file and class names may hold terminal escape sequences
    progress = predict.Progress(sys.stderr) if writers else None  # else every result is printed anyway
    seen = failed = 0
    try:
        for result in predict.classify(model_dir, predict.expand_inputs(args.images),
                                       top=predict.EVERY_CLASS if automl else top, max_pixels=config.max_pixels,
                                       threshold=threshold):
            seen += 1
            failed += "error" in result
            for w in writers:
                w.write(result)
            if progress:
                progress.update(seen)
            if writers and seen > PREDICT_SHOWN:
                continue
            if "error" in result:
                print(f"{show(result['path'])}: error: {show(result['error'])}", file=sys.stderr)
            else:
                shown = ", ".join(f"{show(name)} ({p:.3f})" for name, p in result["predictions"][:top])
                print(f"{show(result['path'])}: " + (f"unsure (best: {shown})" if result.get("unsure") else shown))
        if progress:
            progress.update(seen, final=True)
        for w in writers:  # a results file appears under its name only when every input is in it
            w.close(complete=seen > 0)
    except (predict.ModelUnusable, predict.InputError) as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    finally:
        for w in writers:
            w.close(complete=False)  # interrupted or failed: removed (no-op once closed)
    if not seen:
        return _fail(EXIT_BAD_INPUT, "no image files in " + ", ".join(args.images))
    if writers:
        print(f"{seen:,} inputs: {seen - failed:,} classified, {failed:,} failed; results in "
              + " and ".join(w.path for w in writers))
    return EXIT_RUN_FAILED if failed else 0


def _announce_dataflow_job(result) -> None:
    """Where to follow a submitted Dataflow job (its workers' progress and logs are there, not here)."""
    job = result._job  # DataflowPipelineResult keeps the service's Job message; job_id() reads it too
    print(f"Dataflow job {result.job_id()}: https://console.cloud.google.com/dataflow/jobs/{job.location}/"
          f"{result.job_id()}?project={job.projectId}", flush=True)


def _predict_with_beam(args: argparse.Namespace, config: PipelineConfig, model_dir: str, top: int,
                       threshold: float) -> int:
    """`predict --workers N` / `--dataflow`: the same results through Beam's RunInference, into --output."""
    _quiet_logs(verbose=False)  # before Beam's import, which warns about this Python's support
    os.environ["PYTHONWARNINGS"] = "ignore"  # and so would each of its worker processes
    from pipeline import batch_predict, predict

    if not args.output:
        raise predict.InputError(f"--{'dataflow' if args.dataflow else 'workers'} writes every result to a file: "
                                 "give --output results.jsonl (or .csv)")
    predict.output_kind(args.output)
    temp_dir = None
    if args.dataflow:
        cloud = config_from_args(args, CloudConfig)
        temp_dir = batch_predict.check_dataflow(cloud, config, model_dir, args.output, args.images)
        from kubeflow.cloud_platform import dataflow_args

        beam_args = dataflow_args(config, cloud)
    else:
        for path in (args.output, args.automl_output):
            if path:
                batch_predict.check_local_output(path)
        beam_args = batch_predict.local_args(args.workers)
    try:
        counts = batch_predict.run(model_dir, predict.expand_inputs(args.images), args.output, top,
                                   config.max_pixels, beam_args, temp_dir=temp_dir,
                                   progress=lambda total, stream: predict.Progress(stream, total),
                                   started=_announce_dataflow_job if args.dataflow else None,
                                   threshold=threshold, automl_output=args.automl_output)
    except Exception as e:  # noqa: BLE001 - Beam wraps a worker's exception in its own types
        unusable = batch_predict.worker_error(e)  # the model is loaded by the workers, not here
        if unusable:
            raise predict.ModelUnusable(unusable) from None
        raise
    if not counts["inputs"]:
        return _fail(EXIT_BAD_INPUT, "no image files in " + ", ".join(args.images))
    print(f"{counts['inputs']:,} inputs: {counts['classified']:,} classified, {counts['failed']:,} failed; "
          f"results in {args.output}" + (f" and {args.automl_output}" if args.automl_output else ""))
    return EXIT_RUN_FAILED if counts["failed"] else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        commands = {"run": cmd_run, "predict": cmd_predict, "sample-data": cmd_sample_data,
                    "export-schema": cmd_export_schema, "compile": cmd_compile, "submit": cmd_submit,
                    "schedule": cmd_schedule, "report": cmd_report, "runs": cmd_runs, "cache": cmd_cache}
        return commands[args.command](args)
    except ConfigError as e:
        return _fail(EXIT_BAD_INPUT, str(e))
    except KeyboardInterrupt:
        return _fail(EXIT_INTERRUPTED, "interrupted")


if __name__ == "__main__":
    sys.exit(main())
