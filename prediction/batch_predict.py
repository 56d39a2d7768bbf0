"""Batch prediction on Beam: what `imagepipe predict --workers N` and `--dataflow` run.

    input list (a text file of [path, problem, size] lines) -> Reshuffle -> ReadImage (per-file errors
    on the side) -> RunInference(ImageModelHandler), batched by encoded bytes -> JSONL or CSV lines
    -> one results file

The same per-file checks, batch labelling and record formats as the in-process `predict`
(prediction/predict.py); only the execution differs: Beam's RunInference batches and keeps one
model per worker, and the runner spreads files over worker processes (or Dataflow workers).
Results come in the order workers finish them, each with its path. Beam writes the results file
under a temporary name and moves it into place when the whole job succeeded.
"""

import contextlib
import csv
import io
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import ModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions

import stacks
from prediction import image_inputs, predict, result_files
from storage import files as fs
from storage.spreadsheet import spreadsheet_safe

NAMESPACE = "imagepipe.predict"


class _Loaded:
    """A worker's model: its serving call, and its explainer with --explain (a class of its own: Beam's shared
    model handle keeps a weak reference to it, which a tuple or SimpleNamespace cannot have)."""

    def __init__(self, serve, explainer):
        self.serve, self.explainer = serve, explainer


class ImageModelHandler(ModelHandler):
    """Loads the model's serving call (a SavedModel's serving_default, or a .tflite file) once per worker;
    a batch is (path, encoded bytes) pairs."""

    def __init__(self, model_dir: str, top: int, threshold: float = 0.0, explain_dir: Optional[str] = None):
        """explain_dir: also explain each image's top class (trainer/explain.py) into this folder (a local one:
        the driver moves it into place whole)."""
        super().__init__()
        self._model_dir, self._top, self._threshold = model_dir, top, threshold
        self._explain_dir = explain_dir

    def load_model(self):
        if self._explain_dir:  # one load: the explainer's serving signature classifies too
            explainer = predict.explainer_for(self._model_dir)
            return _Loaded(explainer.serving, explainer)
        return _Loaded(predict.load_serving(self._model_dir), None)

    def run_inference(self, batch: Sequence[Tuple[str, bytes]], model, inference_args=None) -> Iterable[Dict]:
        serve, explainer = model.serve, model.explainer
        results = []
        # BatchElements bounds a batch's encoded bytes; model calls also take at most 64 images, as in
        # the in-process predict, so small files do not make calls of hundreds of decoded images.
        for chunk in image_inputs.byte_batches(batch, size=lambda item: len(item[1])):
            labels = predict.label_batch(serve, [data for _, data in chunk], self._top, self._threshold)
            found = [{"path": path, **label} for (path, _), label in zip(chunk, labels)]
            if explainer is not None:
                kept = [(r, data) for r, (_, data) in zip(found, chunk) if "error" not in r]
                predict.explained(explainer, [r for r, _ in kept], [data for _, data in kept])
                for result in found:
                    result_files.write_explanation(self._explain_dir, result)
            results += found
        return results

    def get_num_bytes(self, batch: Sequence[Tuple[str, bytes]]) -> int:
        return sum(len(data) for _, data in batch)  # the default pickles the whole batch to measure it

    def batch_elements_kwargs(self):
        # Batches are measured in encoded bytes, as the in-process predict bounds them: a batch of
        # full-size photos stays a handful of images, one of thumbnails a few hundred.
        return {
            "min_batch_size": 1,
            "max_batch_size": image_inputs.BATCH_BYTES,
            "element_size_fn": lambda element: max(1, len(element[1])),
        }


class ReadImage(beam.DoFn):
    """(path, problem) -> (path, bytes) for a readable image; {'path', 'error'} on the 'errors' output.

    With a progress_dir (local runs), each worker keeps its count of files read in a file there, which
    the driver adds up for its progress line; Dataflow shows its own element counts.
    """

    def __init__(self, max_pixels: int, progress_dir: Optional[str] = None):
        self._max_pixels, self._progress_dir = max_pixels, progress_dir

    def setup(self):
        self._read, self._noted = 0, 0.0
        self._progress_file = (
            os.path.join(self._progress_dir, f"{os.getpid()}-{uuid.uuid4().hex}") if self._progress_dir else None
        )

    def _note_progress(self, force: bool = False):
        if self._progress_file and (force or time.monotonic() - self._noted > 0.5):
            with open(self._progress_file + ".tmp", "w") as f:
                f.write(str(self._read))
            os.replace(self._progress_file + ".tmp", self._progress_file)
            self._noted = time.monotonic()

    def finish_bundle(self):
        self._note_progress(force=True)

    def process(self, line: str):
        result = image_inputs.inspect_input(image_inputs.Input(*json.loads(line)), self._max_pixels)
        self._read += 1
        self._note_progress()
        if "error" in result:
            beam.metrics.Metrics.counter(NAMESPACE, "failed").inc()
            yield beam.pvalue.TaggedOutput("errors", result)
        else:
            yield result["path"], result["data"]


def count_result(result: Dict) -> Dict:
    if "error" in result:
        beam.metrics.Metrics.counter(NAMESPACE, "failed").inc()
    else:
        beam.metrics.Metrics.counter(NAMESPACE, "classified").inc()
    return result


def csv_text(cells: List[str]) -> str:
    text = io.StringIO()
    csv.writer(text, lineterminator="").writerow(cells)
    return text.getvalue()


class Job(NamedTuple):
    """What a batch prediction does: the model, where the results go (`output`; with automl_output, in Vertex
    AutoML's batch prediction shape there too: every class above the confidence threshold; with explain_dir, each
    image's map there, and their index.csv), the classes kept a result, the pixel bound."""

    model_dir: str
    output: str
    top: int
    max_pixels: int
    threshold: float = 0.0
    automl_output: Optional[str] = None
    explain_dir: Optional[str] = None


def build(p: beam.Pipeline, input_list: str, job: Job, progress_dir: Optional[str] = None) -> None:
    """The Beam job: every input of input_list read, classified and written as `job` says."""
    model_dir, output, top, max_pixels, threshold, automl_output, explain_dir = job
    read = (
        p
        | "ListInputs" >> beam.io.ReadFromText(input_list, validate=False)  # written just before the job
        | "Spread" >> beam.Reshuffle()  # the list is one file: without this one worker reads every image
        | "ReadImage" >> beam.ParDo(ReadImage(max_pixels, progress_dir)).with_outputs("errors", main="images")
    )
    labelled = (
        read.images
        | "Classify"
        >> RunInference(
            ImageModelHandler(model_dir, predict.EVERY_CLASS if automl_output else top, threshold, explain_dir)
        )
        | "Count" >> beam.Map(count_result)
    )
    merged = _write_results(labelled, read.errors, output, top, threshold)
    if automl_output:
        _ = (
            merged
            | "FormatAutoML" >> beam.Map(lambda result: result_files.automl_record(result, threshold))
            | "WriteAutoML" >> beam.io.WriteToText(automl_output, shard_name_template="", num_shards=1)
        )
    if explain_dir:
        _write_explanation_index(labelled, explain_dir)


def _write_results(labelled, errors, output: str, top: int, threshold):
    """The classified images and the unreadable ones, as JSONL or CSV lines into `output`; returns them merged."""
    if result_files.output_kind(output) == ".csv":
        multi = predict.is_multi_label(threshold)
        header = csv_text(result_files.csv_header(top, multi))
        format_result = "Format" >> beam.Map(lambda result: csv_text(result_files.csv_cells(result, top, multi)))
    else:
        header = None
        format_result = "Format" >> beam.Map(lambda result: result_files.json_record(result, top))
    merged = (labelled, errors) | "Merge" >> beam.Flatten()
    _ = (
        merged
        | format_result
        | "Write" >> beam.io.WriteToText(output, shard_name_template="", num_shards=1, header=header)
    )
    return merged


def _write_explanation_index(labelled, explain_dir: str) -> None:
    """The index.csv of the maps the workers wrote into explain_dir: one row per explained image."""
    _ = (
        labelled
        | "Explained" >> beam.Filter(lambda result: "overlay" in result)
        | "FormatExplained"
        >> beam.Map(
            lambda result: csv_text(
                [
                    spreadsheet_safe(cell)
                    for cell in (
                        result["path"],
                        result["predictions"][0][0],
                        f"{result['predictions'][0][1]:.6f}",
                        result["overlay"],
                        result["attribution_file"],
                    )
                ]
            )
        )  # names are the user's: never formulas
        | "WriteIndex"
        >> beam.io.WriteToText(
            fs.join(explain_dir, result_files.EXPLANATIONS_INDEX),
            shard_name_template="",
            num_shards=1,
            header=",".join(result_files.EXPLANATION_COLUMNS),
        )
    )


def local_args(workers: int) -> List[str]:
    """Beam's portable runner with `workers` processes, each with its own model, on this machine.

    Each worker's TensorFlow gets its share of the cores (the workers inherit this process's
    environment): N workers each starting a thread per core would fight over them.
    """
    share = str(max(1, (os.cpu_count() or 1) // workers))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", share)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", share)
    return [
        f"--runner={stacks.LOCAL_BEAM_RUNNER}",
        f"--direct_num_workers={workers}",
        "--default_sdk_harness_log_level=CRITICAL",
        "--direct_running_mode=multi_processing" if workers > 1 else "--direct_running_mode=in_memory",
    ]


def run(
    job: Job,
    inputs: Iterable[image_inputs.Input],
    beam_args: List[str],
    temp_dir: Optional[str] = None,
    progress=None,
    started=None,
) -> Dict[str, int]:
    """Classifies every input into job.output with Beam; {'inputs', 'classified', 'failed'}.

    The input list is written to temp_dir (a gs:// folder for Dataflow, whose workers cannot read
    this machine's files) and removed afterwards. `progress(total, stream)` makes an object whose
    update(done[, final]) is called as local workers read files (result_files.PredictionProgress); `started(result)`
    is called once the job is submitted (Dataflow: its id, to follow it in the console).
    """
    workdir = tempfile.mkdtemp(prefix="imagepipe-predict-")
    input_list = fs.join(temp_dir or workdir, f"predict-inputs-{uuid.uuid4().hex}.jsonl")
    local = not temp_dir
    try:
        count = write_input_list(input_list, inputs)
        if not count:
            return {"inputs": 0, "classified": 0, "failed": 0}
        progress_dir = os.path.join(workdir, "progress") if local else None
        if progress_dir:
            os.makedirs(progress_dir)
        with stderr_to(os.path.join(workdir, "workers.log") if local else None) as console:
            with watch_progress(progress_dir, progress(count, console) if progress else None):
                p = beam.Pipeline(options=PipelineOptions(beam_args))
                build(p, input_list, job, progress_dir)
                result = p.run()
                if started:
                    started(result)
                result.wait_until_finish()  # raises when the job failed
        counters = _job_counters(result)
    except BaseException as e:
        _clean_up_failed_job(e, job.output, job.automl_output, workdir, local)
        raise
    finally:
        if temp_dir:
            _remove_input_list(input_list)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"inputs": count, "classified": counters.get("classified", 0), "failed": counters.get("failed", 0)}


def _job_counters(result) -> Dict[str, int]:
    """The finished job's counters of this namespace (count_result, ReadImage), by name."""
    return {
        c.key.metric.name: c.committed
        for c in result.metrics().query()["counters"]
        if c.key.metric.namespace == NAMESPACE
    }


def _clean_up_failed_job(
    e: BaseException, output: str, automl_output: Optional[str], workdir: str, local: bool
) -> None:
    """After a failed or interrupted job: Beam's temporary result files go, and on a local run an unforeseen
    failure shows the end of what the workers said."""
    remove_beam_temp(output)
    if automl_output:
        remove_beam_temp(automl_output)
    log = os.path.join(workdir, "workers.log")
    if local and not worker_error(e) and os.path.exists(log):  # unforeseen: what the workers said helps
        with open(log, errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-30:]))


def _remove_input_list(input_list: str) -> None:
    """The input list written to the Dataflow temp folder."""
    if FileSystems.exists(input_list):
        FileSystems.delete([input_list])


@contextlib.contextmanager
def stderr_to(path: Optional[str]):
    """Beam's local worker processes write their logs and every failed bundle's traceback to the
    stderr they inherit: send it to `path` while the job runs. Yields a stream on the real stderr
    (for the progress line); with no path, sys.stderr itself."""
    if not path:
        yield sys.stderr
        return
    sys.stderr.flush()
    saved = os.dup(2)
    console = os.fdopen(os.dup(saved), "w")
    with open(path, "wb") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield console
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        console.close()


@contextlib.contextmanager
def watch_progress(progress_dir: Optional[str], progress):
    """While the job runs, adds up the workers' counts in progress_dir every half second for `progress`."""
    if not (progress_dir and progress):
        yield
        return
    done = threading.Event()

    def files_read() -> int:
        total = 0
        for name in os.listdir(progress_dir):
            if name.endswith(".tmp"):
                continue  # being replaced
            try:
                with open(os.path.join(progress_dir, name)) as f:
                    total += int(f.read() or 0)
            except (OSError, ValueError):
                continue  # gone between the listing and the read
        return total

    def watch():
        while not done.wait(0.5):
            progress.update(files_read())

    watcher = threading.Thread(target=watch, name="predict-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        progress.update(files_read(), final=True)


def check_local_output(output: str) -> None:
    """InputError unless the results file's folder exists and is writable (before any image is read)."""
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise image_inputs.InputError(f"--output {output}: cannot write there (no such folder, or not writable)")


def check_dataflow(
    cloud, config, model_dir: str, output: str, inputs: List[str], automl_output: Optional[str] = None
) -> str:
    """The gs:// folder for the job's input list; InputError for a setting Dataflow workers cannot use."""
    if not cloud.project:
        raise image_inputs.InputError("--dataflow needs --project (or IMAGEPIPE_PROJECT)")
    if not cloud.image:
        raise image_inputs.InputError(
            "--dataflow needs --image: the pipeline image (./Dockerfile), which Dataflow workers run"
        )
    named = [("--model", model_dir), ("--output", output), ("--automl-output", automl_output)]
    for option, path in [*[(o, p) for o, p in named if p], *[("INPUT", item) for item in inputs]]:
        if not path.startswith("gs://"):
            raise image_inputs.InputError(
                f"{option} {path}: Dataflow workers cannot read this machine's files; give a gs:// path"
            )
    cloud.check_names()  # ConfigError: one line naming the option
    temp = cloud.dataflow_temp(config.pipeline_name)
    if not temp or not temp.startswith("gs://"):
        raise image_inputs.InputError("--dataflow needs a gs:// --dataflow-temp-location (or --pipeline-root)")
    return temp


def write_input_list(path: str, inputs: Iterable[image_inputs.Input]) -> int:
    count = 0
    with fs.open_for_write(path) as f:  # no TensorFlow here: the workers load it, this process need not
        for item in inputs:
            f.write((json.dumps(list(item), ensure_ascii=False) + "\n").encode("utf-8"))
            count += 1
    return count


def worker_error(error: BaseException) -> Optional[str]:
    """The one-line ModelUnusable message inside a Beam job's failure (it carries the worker's traceback)."""
    found = re.search(r"ModelUnusable: (.+)", str(error))
    return found.group(1).strip() if found else None


def remove_beam_temp(output: str) -> None:
    """Beam's staging folder for a results file that was never finished (WriteToText's beam-temp-*)."""
    if fs.is_remote(output):
        return  # Dataflow's own cleanup; a gs:// prefix has no folder to scan cheaply
    folder, name = os.path.split(os.path.abspath(output))
    for entry in os.listdir(folder):
        if entry.startswith(f"beam-temp-{name}-"):
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)
