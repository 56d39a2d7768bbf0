"""The `imagepipe` console script, run as a user would: one-line errors, nothing half-written."""

import os
import re
import subprocess

import pytest
from commands import IMAGEPIPE, run_imagepipe, run_pipeline_module
from conftest import expected_strategy_kind, image_bytes, make_class_tree, write

import stacks
from pipeline.config import PROJECT_DIR, default_pipeline_name


def imagepipe(*args, root):
    own_root = args and args[0] == "run" and "--root" not in args
    return subprocess.run(
        [IMAGEPIPE, *args, "--root", str(root)] if own_root else [IMAGEPIPE, *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def folders(tmp_path):
    make_class_tree(tmp_path / "one", classes=("cat",), per_class=2)
    make_class_tree(tmp_path / "two", per_class=2)
    os.mkdir(tmp_path / "empty")
    write(tmp_path / "nohdr.csv", b"photo-1,cat\n")
    write(tmp_path / "photo.jpg", image_bytes())
    return tmp_path


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--data", "{d}/nope"], "--data {d}/nope: no such file or folder; check the path"),
        (["--data", "{d}/empty"], "no image files found; expected images in class subfolders"),
        (["--data", "{d}/one"], "found only one class ('cat'); a classifier needs at least two"),
        (["--data", "{d}/nohdr.csv"], "first line must be a header naming the columns path,label[,split]"),
        (["--data", "{d}/photo.jpg"], "a file, but not a .csv manifest"),
        (["--bogus"], "unrecognized arguments: --bogus (see 'imagepipe run --help')"),
        (["--eval-percent", "0"], "--eval-percent 0: use a whole number from 1 to 99"),
        (["--schema", "{d}/none.pbtxt"], "no such file; give a schema.pbtxt, or leave it out to infer one"),
        (["--data", "{d}/one", "--span-pattern", "v-{{SPAN}}"], "nothing matches --span-pattern 'v-{{SPAN}}'"),
        (["--tflite", "float16,int4"], "--tflite int4: use float16, int8"),
        (["--cpu-replicas", "0"], "--cpu-replicas 0: use 1 to 16 logical CPU devices"),
        (["--mixed-precision", "maybe"], "argument --mixed-precision: invalid choice: 'maybe'"),
        # A root inside the data: the pipeline ingested its own metadata and artifacts.
        (["--data", "{d}/two", "--root", "{d}/two/.out"], "--root {d}/two/.out is inside --data {d}/two: the pipeline"),
        (["--data", "{d}/two", "--root", "{d}/two"], "--root {d}/two is inside --data {d}/two"),
        # DataflowRunner for a local run failed with "Pipeline has validations errors:" and nothing else.
        (
            ["--data", "{d}/two", "--beam-arg=--runner=DataflowRunner"],
            "--beam-arg --runner=DataflowRunner: `imagepipe run` runs Beam on this machine",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(folders, args, expected):
    root = folders / "root"
    result = imagepipe("run", *[a.format(d=folders) for a in args], root=root)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected.format(d=folders) in lines[0]
    assert not root.exists()


@pytest.mark.slow
def test_run_prints_what_each_component_did(cli_runs):
    result = cli_runs["text"]  # `imagepipe run --no-cache` on 300 digits, the default text output
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.splitlines()[0] == f"imagepipe on the {stacks.describe()}"  # the first line names the stack
    assert "300 files, 10 classes, folders layout" in out
    assert re.search(r"ImageExampleGen +ran .*300 files -> 300 examples", out)
    assert re.search(r"DataValidationGate +ran .*passed: no anomalies", out)
    assert re.search(rf"Trainer +ran .*3 epochs on {expected_strategy_kind()} ", out)
    # 3 epochs is the cap here, and 300 digits are still being learnt then: the line says so.
    assert re.search(r"Trainer +ran .*; still improving at the last epoch: raise --epochs", out)
    assert re.search(r"Pusher +ran ", out) and "tensorboard --logdir" in out
    assert out.strip().splitlines()[-1].startswith("report: ")


def test_sample_data_command(tmp_path):
    result = imagepipe("sample-data", "--out", str(tmp_path / "digits"), root=None)
    assert result.returncode == 0
    assert "1,797 images in 10 classes" in result.stdout
    assert sorted(os.listdir(tmp_path / "digits"))[:2] == [".complete", "0"]


def test_a_store_that_is_not_a_store_is_one_line_before_the_run(tmp_path, small_digits):
    name = default_pipeline_name(small_digits)
    os.makedirs(tmp_path / "metadata" / name / "metadata.db")  # a folder where the store should be
    result = imagepipe("run", "--data", small_digits, "--schema", "schemas/digits/schema.pbtxt", root=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"imagepipe: error: {tmp_path}/metadata/{name}/metadata.db: not an ML Metadata store (a folder, not a "
        "file); move it away (the next run starts a new one) or use another --root"
    ]
    assert "run " not in result.stdout  # no summary, of this run or an older one


PRODUCTION = [
    "--project",
    "proj-1",
    "--region",
    "europe-west4",
    "--pipeline-root",
    "gs://bucket-1/pipelines",
    "--image",
    "europe-west4-docker.pkg.dev/proj-1/imagepipe/pipeline:v3",
    "--data",
    "gs://bucket-1/images",
    "--name",
    "pets",
]


def test_compile_writes_a_job_for_each_target(tmp_path):
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    vertex = run_imagepipe("compile", *PRODUCTION, "--output", str(tmp_path / "job.json"))
    assert vertex.returncode == 0, vertex.stderr[-2000:]
    assert vertex.stdout.strip() == (
        f"wrote {tmp_path}/job.json: PipelineJob for Vertex AI, image {PRODUCTION[7]}, "
        "pipeline root gs://bucket-1/pipelines/pets"
    )
    job = json_format.Parse(open(tmp_path / "job.json").read(), pipeline_spec_pb2.PipelineJob())
    assert job.display_name == "pets" and "Pusher" in job.pipeline_spec["root"]["dag"]["tasks"]

    kubeflow = run_imagepipe("compile", *PRODUCTION, "--target", "kubeflow", "--output", str(tmp_path / "spec.yaml"))
    assert kubeflow.returncode == 0 and "PipelineSpec package for kfp.Client" in kubeflow.stdout
    import yaml

    spec = yaml.safe_load(open(tmp_path / "spec.yaml"))
    assert spec["defaultPipelineRoot"] == "gs://bucket-1/pipelines/pets" and "Pusher" in spec["root"]["dag"]["tasks"]

    missing = imagepipe("compile", *PRODUCTION[2:], "--output", str(tmp_path / "no.json"), root=None)
    assert missing.returncode == 2 and not (tmp_path / "no.json").exists()
    assert missing.stderr.strip().splitlines() == [
        "imagepipe: error: no GCP project: give --project (or IMAGEPIPE_PROJECT)"
    ]


def test_submit_dry_run_prints_the_request_and_sends_nothing():
    result = imagepipe("submit", "--dry-run", *PRODUCTION, "--no-cache", root=None)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "would submit (dry run, nothing sent):"
    assert {
        "  target: vertex",
        "  where: projects/proj-1/locations/europe-west4",
        "  pipeline: pets",
        "  pipeline_root: gs://bucket-1/pipelines/pets",
        "  data: gs://bucket-1/images",
    } <= set(lines)
    assert "  enable_caching: True" not in lines  # --no-cache reached the request


@pytest.mark.slow
def test_local_runner_module_reads_settings_from_the_environment(tmp_path):
    make_class_tree(tmp_path / "data", per_class=12)
    env = {
        **os.environ,
        "IMAGEPIPE_ROOT": str(tmp_path / "root"),
        "IMAGEPIPE_DATA": str(tmp_path / "data"),
        "IMAGEPIPE_EPOCHS": "1",
        "IMAGEPIPE_EXPLANATIONS": "0",
        "IMAGEPIPE_IMAGE_SIZE": "32",
        "IMAGEPIPE_ACCURACY_THRESHOLD": "0",
    }
    done = run_pipeline_module("pipeline.local_runner", cwd=PROJECT_DIR, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"ImageExampleGen +ran .*24 files -> 24 examples", done.stdout)
    assert re.search(r"Trainer +ran .*1 epochs? on", done.stdout) and re.search(r"Pusher +ran", done.stdout)
    (pipeline_name,) = os.listdir(tmp_path / "root" / "serving")
    assert pipeline_name == default_pipeline_name(str(tmp_path / "data"))

    env["IMAGEPIPE_EPOCHS"] = "many"
    bad = run_pipeline_module("pipeline.local_runner", cwd=PROJECT_DIR, env=env, timeout=600)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "local_runner: error: IMAGEPIPE_EPOCHS='many': not a whole number; give a whole number, or unset the "
        "environment variable"
    )


def test_names_are_printed_with_control_characters_escaped():
    from prediction.result_files import printable

    # A class folder or file named with an escape sequence (clear screen) or a bidi override.
    assert printable("cat\x1b[2J\u202egpj.exe") == "cat\\x1b[2J\\u202egpj.exe"
    assert printable("Ünïcode 猫 ok") == "Ünïcode 猫 ok"


def test_progress_of_a_long_prediction_run_is_one_line_per_interval():
    import io

    from prediction.result_files import PredictionProgress

    log = io.StringIO()  # not a terminal: plain lines, for logs
    progress = PredictionProgress(log, total=400, every=0)
    for done in (100, 400):
        progress.update(done)
    progress.update(400, final=True)
    lines = log.getvalue().splitlines()
    assert [re.sub(r"[\d,]+/s$", "R/s", line) for line in lines] == [
        "100/400 (25%) inputs done, R/s",
        "400/400 (100%) inputs done, R/s",
        "400/400 (100%) inputs done, R/s",
    ]

    quiet = io.StringIO()  # a run shorter than the interval says nothing
    progress = PredictionProgress(quiet, every=30)
    progress.update(5)
    progress.update(5, final=True)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--workers", "-1"], "--workers -1: give a number of processes (1 or more)"),
        (["--dataflow", "--output", "gs://b/out.jsonl"], "--dataflow needs --project (or IMAGEPIPE_PROJECT)"),
        (
            ["--dataflow", "--output", "gs://b/out.jsonl", "--project", "p"],
            "--dataflow needs --image: the pipeline image (./Dockerfile), which Dataflow workers run",
        ),
        (
            ["--dataflow", "--output", "gs://b/out.jsonl", "--project", "p", "--image", "i"],
            "--model {model}: Dataflow workers cannot read this machine's files; give a gs:// path",
        ),
        (
            ["--workers", "2", "--output", "/no/such/folder/out.jsonl"],
            "--output /no/such/folder/out.jsonl: cannot write there (no such folder, or not writable)",
        ),
        (["--workers", "2", "--output", "out.txt"], "--output out.txt: name a .jsonl or .csv file"),
        (["--top", "0"], "--top 0: give the number of classes to show per image (1 or more)"),  # it was 1
        (["--top", "-5"], "--top -5: give the number of classes to show per image (1 or more)"),
        (["--workers", "100000", "--output", "out.jsonl"], "--workers 100000: this machine has {cores} cores"),
    ],
)
def test_batch_prediction_settings_are_checked_before_any_image_is_read(tmp_path, options, expected):
    model = tmp_path / "model"
    write(model / "saved_model.pb", b"")  # never loaded: each of these is refused before
    done = run_imagepipe(
        "predict",
        "--model",
        str(model),
        *options,
        str(tmp_path),
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("IMAGEPIPE_")},
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("imagepipe: error: " + expected.format(model=model, cores=len(os.sched_getaffinity(0))))


def test_an_explicit_model_needs_no_pipeline_name(tmp_path):
    """--model names the model: a root holding two pipelines made predict ask for --name all the same."""
    for name in ("cats", "dogs"):
        write(tmp_path / "root" / "metadata" / name / "metadata.db", b"")
    env = dict(os.environ, IMAGEPIPE_ROOT=str(tmp_path / "root"))
    done = run_imagepipe("predict", "--model", str(tmp_path / "nomodel"), str(tmp_path), timeout=120, env=env)
    assert done.returncode == 2 and "--name" not in done.stderr
    assert done.stderr.startswith(f"imagepipe: error: --model {tmp_path / 'nomodel'}: no SavedModel there")
