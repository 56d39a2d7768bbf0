"""`imagepipe predict`: classify images with a pushed model, in this process or with Beam (prediction/)."""

import argparse
import os
import sys

from cli.common import EXIT_BAD_INPUT, EXIT_RUN_FAILED, config_from_args, existing_pipeline, fail, quiet_logs
from pipeline.cloud_config import CloudConfig
from pipeline.config import ConfigError, PipelineConfig
from storage import files as fs
from storage.user_files import FolderWriter

PREDICT_SHOWN = 10  # `imagepipe predict --output`: results shown on the terminal before the summary line


def cmd_predict(args: argparse.Namespace) -> int:
    # PIL (~0.1 s): not at the CLI's start-up, which imports this module
    from prediction import image_inputs, predict, result_files

    # An explicit --model needs no pipeline (existing_pipeline asks for --name when the root has several).
    config = config_from_args(args) if args.model_dir else existing_pipeline(args)
    model = args.model_dir or config.serving_dir
    top = args.top
    _check_predict_options(args)
    writer = automl = None
    try:
        model_dir, threshold, how = _model_and_outputs(args, model)
        multi = predict.is_multi_label(threshold)
        if args.workers < 0:
            raise image_inputs.InputError(f"--workers {args.workers}: give a number of processes (1 or more)")
        if args.workers or args.dataflow:
            return _predict_with_beam(args, config, model_dir, top, threshold)
        writer = result_files.ResultWriter(args.output, top, multi_label=multi) if args.output else None
        automl = (
            result_files.ResultWriter(args.automl_output, top, automl_threshold=threshold)
            if args.automl_output
            else None
        )
        explanations = result_files.ExplanationWriter(args.explain) if args.explain else None  # last: nothing after
        # it can fail and leave its temporary folder
    except (predict.ModelNotFound, predict.ModelUnusable, image_inputs.InputError) as e:
        for opened in (writer, automl):  # their temporary files go: nothing was classified
            if opened:
                opened.close(complete=False)
        return fail(EXIT_BAD_INPUT, str(e))
    writers = [w for w in (writer, automl, explanations) if w]
    _announce_threshold(threshold, how, multi, result_files.printable)
    quiet_logs(verbose=False)
    try:
        seen, failed = _classify_and_write(
            args, config, model_dir, top, threshold, writers, every_class=bool(automl), explain=bool(explanations)
        )
        for w in writers:  # a results file appears under its name only when every input is in it
            w.close(complete=seen > 0)
    except (predict.ModelUnusable, image_inputs.InputError) as e:
        return fail(EXIT_BAD_INPUT, str(e))
    finally:
        for w in writers:
            w.close(complete=False)  # interrupted or failed: removed (no-op once closed)
    if not seen:
        return fail(EXIT_BAD_INPUT, "no image files in " + ", ".join(args.images))
    if writers:
        print(
            f"{seen:,} inputs: {seen - failed:,} classified, {failed:,} failed; results in "
            + " and ".join(w.path for w in writers)
        )
    return EXIT_RUN_FAILED if failed else 0


def _check_predict_options(args: argparse.Namespace) -> None:
    """--top, --workers and --confidence-threshold, before any model or input is read."""
    top = args.top
    if top < 1:
        raise ConfigError(f"--top {top}: give the number of classes to show per image (1 or more)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.workers > cores:
        raise ConfigError(
            f"--workers {args.workers}: this machine has {cores} cores, and each worker loads TensorFlow "
            f"and the model (~0.7 GB); use at most {cores}, or --dataflow for more machines"
        )
    if args.confidence_threshold is not None and not 0 <= args.confidence_threshold < 1:
        raise ConfigError(f"--confidence-threshold {args.confidence_threshold}: use a fraction from 0 to below 1")


def _announce_threshold(threshold, how: str, multi: bool, show) -> None:
    """The threshold(s) the results use and where they came from, on stderr."""
    if multi:
        print(
            f"multi-label: a label applies above its threshold ({how}): "
            + ", ".join(f"{show(name)} {t:g}" for name, t in threshold.items()),
            file=sys.stderr,
        )
    elif threshold:
        print(f"confidence threshold {threshold:g} ({how}): at or below it an image is 'unsure'", file=sys.stderr)


def _classify_and_write(
    args: argparse.Namespace,
    config: PipelineConfig,
    model_dir: str,
    top: int,
    threshold,
    writers: list,
    every_class: bool,
    explain: bool,
) -> tuple:
    """Every input classified in this process into each writer, and onto the terminal (only the first
    PREDICT_SHOWN when there are writers): (inputs seen, inputs failed)."""
    # PIL (~0.1 s): not at the CLI's start-up, which imports this module
    from prediction import image_inputs, predict, result_files

    multi = predict.is_multi_label(threshold)
    progress = result_files.PredictionProgress(sys.stderr) if writers else None  # else every result is printed anyway
    seen = failed = 0
    for result in predict.classify(
        model_dir,
        image_inputs.expand_inputs(args.images),
        top=predict.EVERY_CLASS if every_class else top,
        max_pixels=config.max_pixels,
        threshold=threshold,
        explain=explain,
    ):
        seen += 1
        failed += "error" in result
        for w in writers:
            w.write(result)
        if progress:
            progress.update(seen)
        if writers and seen > PREDICT_SHOWN:
            continue
        _print_result(result, multi, top, result_files.printable)
    if progress:
        progress.update(seen, final=True)
    return seen, failed


def _model_and_outputs(args: argparse.Namespace, model: str):
    """The model folder and its threshold(s), once the inputs and every output are known to be usable, before
    anything is classified: (model_dir, threshold, where the threshold came from)."""
    # PIL (~0.1 s): not at the CLI's start-up, which imports this module
    from prediction import image_inputs, predict, result_files

    try:  # file:// URIs are local paths; a store nothing here reads (s3://, http://) is one line
        args.images = [fs.local_or_supported(item, item) for item in args.images]
    except fs.DataError as e:
        raise image_inputs.InputError(str(e)) from None
    outputs = {"--output": args.output, "--automl-output": args.automl_output}
    for option, path in outputs.items():
        if path:  # before the model loads: a bad output file is one line at once
            result_files.output_kind(path, option)
    # Never over an input (a manifest, an import file) or a file predict did not write, nor into the model.
    result_files.check_outputs(outputs, args.images, None)
    model_dir = predict.resolve_model_dir(model)
    result_files.check_outputs(outputs, args.images, model_dir)
    if args.explain:
        result_files.check_explain_folder(args.explain, args.images, list(filter(None, outputs.values())), model_dir)
        if model_dir.endswith(".tflite"):
            raise predict.ModelUnusable(
                f"--model {model_dir}: --explain needs the SavedModel (its gradients); give "
                "the pushed model folder, not its .tflite file"
            )
    threshold, how = predict.model_threshold(model_dir)
    if args.confidence_threshold is not None:  # one for every label of a multi-label model
        threshold = (
            {name: args.confidence_threshold for name in threshold}
            if predict.is_multi_label(threshold)
            else args.confidence_threshold
        )
        how = "--confidence-threshold"
    return model_dir, threshold, how


def _print_result(result, multi: bool, top: int, show) -> None:
    """One result on the terminal; `show` makes file and class names printable (no escape sequences)."""
    if "error" in result:
        print(f"{show(result['path'])}: error: {show(result['error'])}", file=sys.stderr)
    elif multi:
        shown = ", ".join(f"{show(name)} ({p:.3f})" for name, p in result["labels"])
        print(f"{show(result['path'])}: " + (shown or "no label"))
    else:
        shown = ", ".join(f"{show(name)} ({p:.3f})" for name, p in result["predictions"][:top])
        print(f"{show(result['path'])}: " + (f"unsure (best: {shown})" if result.get("unsure") else shown))


def _announce_dataflow_job(result) -> None:
    """Where to follow a submitted Dataflow job (its workers' progress and logs are there, not here)."""
    job = result._job  # DataflowPipelineResult keeps the service's Job message; job_id() reads it too
    print(
        f"Dataflow job {result.job_id()}: https://console.cloud.google.com/dataflow/jobs/{job.location}/"
        f"{result.job_id()}?project={job.projectId}",
        flush=True,
    )


def _predict_with_beam(
    args: argparse.Namespace, config: PipelineConfig, model_dir: str, top: int, threshold: float
) -> int:
    """`predict --workers N` / `--dataflow`: the same results through Beam's RunInference, into --output."""
    quiet_logs(verbose=False)  # before Beam's import, which warns about this Python's support
    os.environ["PYTHONWARNINGS"] = "ignore"  # and so would each of its worker processes
    # Apache Beam (~2 s): after the warnings are off; not at the CLI's start-up, which imports this module
    from prediction import batch_predict, image_inputs, predict, result_files

    if not args.output:
        raise image_inputs.InputError(
            f"--{'dataflow' if args.dataflow else 'workers'} writes every result to a file: "
            "give --output results.jsonl (or .csv)"
        )
    beam_args, temp_dir = _beam_args(args, config, model_dir)
    explanations = _explanations_folder(args)
    try:
        job = batch_predict.Job(
            model_dir,
            args.output,
            top,
            config.max_pixels,
            threshold,
            args.automl_output,
            explanations.partial if explanations else None,
        )
        counts = batch_predict.run(
            job,
            image_inputs.expand_inputs(args.images),
            beam_args,
            temp_dir=temp_dir,
            progress=lambda total, stream: result_files.PredictionProgress(stream, total),
            started=_announce_dataflow_job if args.dataflow else None,
        )
    except Exception as e:  # noqa: BLE001 - Beam wraps a worker's exception in its own types
        unusable = batch_predict.worker_error(e)  # the model is loaded by the workers, not here
        if unusable:
            raise predict.ModelUnusable(unusable) from None
        raise
    finally:
        if explanations and sys.exc_info()[0] is not None:
            explanations.close(complete=False)  # a failed job leaves no folder of maps behind
    if explanations:
        explanations.close(complete=counts["inputs"] > 0)
    if not counts["inputs"]:
        return fail(EXIT_BAD_INPUT, "no image files in " + ", ".join(args.images))
    print(
        f"{counts['inputs']:,} inputs: {counts['classified']:,} classified, {counts['failed']:,} failed; "
        f"results in {args.output}"
        + (f" and {args.automl_output}" if args.automl_output else "")
        + (f" and {args.explain}" if args.explain else "")
    )
    return EXIT_RUN_FAILED if counts["failed"] else 0


def _beam_args(args: argparse.Namespace, config: PipelineConfig, model_dir: str):
    """Beam's options for Dataflow or for --workers local processes, once the outputs are known to be writable
    there: (beam_args, the Dataflow temp folder or None)."""
    from prediction import batch_predict  # Apache Beam (~2 s): not at the CLI's start-up

    temp_dir = None
    if args.dataflow:
        cloud = config_from_args(args, CloudConfig)
        temp_dir = batch_predict.check_dataflow(cloud, config, model_dir, args.output, args.images, args.automl_output)
        from kubeflow.cloud_platform import dataflow_args  # TFX (~12 s): only --dataflow needs it

        beam_args = dataflow_args(config, cloud)
    else:
        for path in (args.output, args.automl_output):
            if path:
                batch_predict.check_local_output(path)
        beam_args = batch_predict.local_args(args.workers)
    return beam_args, temp_dir


def _explanations_folder(args: argparse.Namespace):
    """The --explain folder the workers write their maps into, or None."""
    # PIL (~0.1 s): not at the CLI's start-up, which imports this module
    from prediction import image_inputs, result_files

    if not args.explain:
        return None
    if args.dataflow:
        raise image_inputs.InputError(
            "--explain runs in this process or with --workers (the maps go to a local "
            "folder, moved into place whole); leave out --dataflow, or --explain"
        )
    try:
        return FolderWriter(args.explain, "--explain", result_files.EXPLANATIONS_KIND)
    except ConfigError as e:
        raise image_inputs.InputError(str(e)) from None
