"""The whole DAG under LocalDagRunner with SQLite ML Metadata: counts, caching, and the validation gate."""

import csv
import itertools
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_data_validation as tfdv
from commands import run_imagepipe
from conftest import expected_strategy_kind, image_bytes, write
from fake_endpoints import FakeService
from tfx import v1 as tfx
from tfx.dsl.component.experimental.decorators import component
from tfx.orchestration import metadata

import stacks
from cli.main import main as cli_main
from components.example_gen.ingest_report import IngestionError
from components.validation.gate import DataValidationError
from pipeline import local_runner, platform, preflight
from pipeline.config import SAMPLE_SCHEMA, PipelineConfig
from pipeline.pipeline import create_pipeline
from prediction import predict
from runs import run_summary, run_text

pytestmark = pytest.mark.slow  # whole pipeline runs (make test-fast leaves them out)


@component
def AfterGate() -> None:
    """Stands for Transform and the rest: must not run when the gate stops the run."""


@pytest.fixture(autouse=True)
def _quiet_registry_warning(recwarn):
    """TFX warns that AfterGate joins a pipeline built elsewhere; that is the point here."""


def run_with_probe(config: PipelineConfig):
    """Runs create_pipeline(config) as far as the validation gate, then a probe component in place of
    Transform and the rest (these tests are about what reaches the Trainer, not training); returns
    the run summary."""
    config = preflight.prepare(config).config  # as the run would be: --model auto's choice made
    os.makedirs(os.path.dirname(config.metadata_path), exist_ok=True)
    p = create_pipeline(
        config, platform.local(config), metadata.sqlite_metadata_connection_config(config.metadata_path)
    )
    gate = next(c for c in p.components if c.id == "DataValidationGate")
    needed, todo = set(), [gate]
    while todo:  # the gate and everything it depends on
        node = todo.pop()
        needed.add(node)
        todo.extend(node.upstream_nodes - needed)
    for node in needed:
        for later in node.downstream_nodes - needed:
            node.remove_downstream_node(later)
    probe = AfterGate()
    probe.add_upstream_node(gate)
    p.components = [c for c in p.components if c in needed] + [probe]
    tfx.orchestration.LocalDagRunner().run(p)
    return run_summary.summarize(config.metadata_path)


def states(summary):
    return {c["component"]: c["state"] for c in summary["components"]}


def details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


ALL_COMPONENTS = (
    "ImageExampleGen",
    "ImportSchemaGen",
    "StatisticsGen",
    "ExampleValidator",
    "DataValidationGate",
    "Transform",
    "DataHealth",
    "DataHealthGate",
    "Trainer",
    "latest_blessed_model_resolver",
    "Evaluator",
    "ModelCard",
    "Pusher",
)


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory):
    """`make run` twice: the default configuration on the digits sample, with the TFLite, ONNX and Core ML exports."""
    config = PipelineConfig(root=str(tmp_path_factory.mktemp("sample")), tflite="float16,int8", exports="onnx,coreml")
    first = local_runner.run(config)
    second = local_runner.run(config)
    return config, first, second


def test_sample_run_ingests_validates_trains_blesses_and_pushes(sample_runs):
    config, first, _ = sample_runs
    assert states(first) == {name: "ran" for name in ALL_COMPONENTS}
    ingest = details(first, "ImageExampleGen")
    assert ingest["files_seen"] == ingest["examples_written"] == 1797
    assert ingest["quarantined"] == 0
    assert ingest["formats"] == {"jpeg": 1198, "png": 599}
    assert ingest["label_map"] == {str(d): d for d in range(10)}
    assert details(first, "DataValidationGate") == {
        "anomalies": [],
        "passed": True,
        "drifted": [],
        "drift": {"skipped": "no blessed model yet"},
    }
    evaluation = details(first, "Evaluator")
    assert evaluation["accuracy"] >= 0.95 and evaluation["example_count"] == 359  # 20% of each class
    assert evaluation["blessed"] and evaluation["baseline_accuracy"] is None  # no baseline yet
    assert details(first, "Trainer")["strategy"].startswith(expected_strategy_kind() + " ")
    # The Trainer reports the epoch it kept, measured on its held-out train images (trainer/holdout.py): the
    # model whose decisions the operating point then measured on them (an image whose top two probabilities tie
    # to float rounding may differ on another CPU: one image).
    trainer = details(first, "Trainer")
    held = trainer["operating_point"]["model_on_held_out"]
    assert trainer["held_out"]["held_out_examples"] == held["images"] == 287  # a fifth of each class's train images
    assert trainer["kept_eval_accuracy"] == pytest.approx(held["argmax"]["accuracy"], abs=1.01 / held["images"])
    pushed = details(first, "Pusher")
    assert pushed["pushed"] and pushed["destination"].startswith(config.serving_dir)
    from components.pusher import PUSH_COMPLETE

    # The version appeared whole (made in a staging folder, PUSH_COMPLETE last, then moved), and nothing else.
    assert os.path.exists(os.path.join(pushed["destination"], PUSH_COMPLETE))
    assert os.path.exists(os.path.join(pushed["destination"], "threshold.json"))
    assert all(name.isdigit() for name in os.listdir(config.serving_dir))
    lines = run_text.format_summary(first)
    assert any("1,797 files -> 1,797 examples" in line for line in lines)
    assert any("BLESSED" in line for line in lines)


def test_transform_writes_its_pixels_as_stored_gzip_records(sample_runs):
    """Transform's records are gzip TFRecords that every reader takes, in stored (level 0) blocks: deflating
    resized pixels cost Transform more than it saved its readers (components/transform/executor.py)."""
    import glob
    import gzip

    config, _, _ = sample_runs
    shards = glob.glob(os.path.join(config.pipeline_root, "Transform", "transformed_examples", "*", "Split-*", "*"))
    assert shards and all(path.endswith(".gz") for path in shards)
    records = 0
    for path in shards:
        with gzip.open(path) as f:
            inflated = len(f.read())
        assert os.path.getsize(path) >= inflated  # stored, not deflated
        records += sum(1 for _ in tf.data.TFRecordDataset(path, compression_type="GZIP"))
    assert records == 1797


def test_pushed_model_classifies_raw_jpeg_and_png_bytes(sample_runs):
    config, first, _ = sample_runs
    serve = tf.saved_model.load(details(first, "Pusher")["destination"]).signatures["serving_default"]
    digits = config.sample_data_dir
    for extension in (".jpg", ".png"):
        chosen = [
            (label, name)
            for label in sorted(os.listdir(digits))
            if not label.startswith(".")
            for name in sorted(os.listdir(os.path.join(digits, label)))
            if name.endswith(extension)
        ][::10]
        images = [open(os.path.join(digits, label, name), "rb").read() for label, name in chosen]
        out = serve(image_bytes=tf.constant(images))
        assert out["probabilities"].shape == (len(images), 10)
        np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
        predicted = [c.decode() for c in out["predicted_class"].numpy()]
        correct = sum(p == label for p, (label, _) in zip(predicted, chosen))
        assert correct / len(chosen) >= 0.95, (extension, correct, len(chosen))
    assert sorted(c.decode() for c in out["class_names"].numpy()[0]) == [str(d) for d in range(10)]


def test_second_run_is_cached_and_compared_with_the_blessed_model(sample_runs):
    _, first, second = sample_runs
    assert second["run_id"] != first["run_id"]
    ran = {name for name, state in states(second).items() if state == "ran"}
    # Only what the new baseline changes runs again: the resolver finds the first model, so the gate
    # compares the data with that model's (no drift: the same data), the Evaluator compares the
    # models, the model card records that comparison, and the Pusher pushes the (still blessed) candidate.
    assert ran == {"latest_blessed_model_resolver", "DataValidationGate", "Evaluator", "ModelCard", "Pusher"}
    card = details(second, "ModelCard")["card"]
    first_model = next(c for c in first["components"] if c["component"] == "Trainer")["outputs"]["model"][0]
    assert card["training"]["lineage"]["base_model"]["artifact"] == first_model
    assert card["evaluation"]["last_blessed"]["accuracy"] == pytest.approx(details(first, "Evaluator")["accuracy"])
    gate = details(second, "DataValidationGate")
    assert gate["passed"] and {c["distance"] for c in gate["drift"]["checks"]} == {0.0}
    assert {states(second)[n] for n in ALL_COMPONENTS if n not in ran} == {"cached"}
    evaluation = details(second, "Evaluator")
    assert evaluation["baseline_accuracy"] == pytest.approx(details(first, "Evaluator")["accuracy"])
    assert evaluation["blessed"]


@pytest.fixture
def spans(tmp_path, small_digits):
    root = tmp_path / "drops"
    shutil.copytree(small_digits, root / "span-1")
    return root


def _add_span_with_new_class(spans):
    shutil.copytree(spans / "span-1", spans / "span-2")
    for n in range(12):
        write(spans / "span-2" / "letter-x" / f"x-{n}.png", image_bytes("PNG", size=(32, 32), mode="L", seed=n))


def test_new_class_in_a_later_span_stops_the_run(tmp_path, spans):
    config = PipelineConfig(
        root=str(tmp_path / "out"), data=str(spans), span_pattern="span-{SPAN}", schema=SAMPLE_SCHEMA
    )
    first = run_with_probe(config)
    assert states(first)["AfterGate"] == "ran"

    _add_span_with_new_class(spans)
    with pytest.raises(DataValidationError) as caught:
        run_with_probe(config)
    message = str(caught.value)
    assert "image/class/text" in message and "letter-x" in message
    second = run_summary.summarize(config.metadata_path)
    assert states(second)["DataValidationGate"] == "FAILED"
    assert not {"AfterGate", "Transform", "Trainer"} & set(states(second))  # nothing downstream ran
    ingest = details(second, "ImageExampleGen")
    assert ingest["source"].endswith("span-2") and "letter-x" in ingest["label_map"]


def test_missing_feature_is_an_anomaly_and_warn_mode_lets_the_run_go_on(tmp_path, small_digits):
    schema = tmp_path / "schema.pbtxt"
    schema.write_text(
        open(SAMPLE_SCHEMA).read()
        + (
            'feature {\n  name: "image/object/bbox/xmin"\n  type: FLOAT\n'
            "  presence {\n    min_fraction: 1.0\n    min_count: 1\n  }\n}\n"
        )
    )
    config = PipelineConfig(root=str(tmp_path / "stop"), data=small_digits, schema=str(schema))
    with pytest.raises(DataValidationError, match="image/object/bbox/xmin"):
        run_with_probe(config)
    assert "AfterGate" not in states(run_summary.summarize(config.metadata_path))

    # The same root: ingestion, statistics and validation come from the stopped run's cache, the gate runs again
    config = PipelineConfig(root=str(tmp_path / "stop"), data=small_digits, schema=str(schema), gate="warn")
    summary = run_with_probe(config)
    assert states(summary)["AfterGate"] == "ran"
    gate = details(summary, "DataValidationGate")
    assert not gate["passed"] and {a["feature"] for a in gate["anomalies"]} == {"image/object/bbox/xmin"}


def test_inferred_schema_then_exported_for_curation(tmp_path, small_digits, capsys):
    config = PipelineConfig(root=str(tmp_path / "out"), data=small_digits)
    summary = run_with_probe(config)
    assert states(summary)["SchemaGen"] == "ran"
    out = tmp_path / "schemas" / "mine" / "schema.pbtxt"
    assert cli_main(["export-schema", "--root", config.root, "--out", str(out)]) == 0
    schema = tfdv.load_schema_text(str(out))
    assert {f.name for f in schema.feature} >= {"image/encoded", "image/class/text", "image/class/label"}
    assert "--schema" in capsys.readouterr().out


def test_failed_ingestion_publishes_nothing(tmp_path, small_digits):
    data = tmp_path / "data"
    shutil.copytree(small_digits, data)
    for n in range(60):
        write(data / "3" / f"bad-{n}.jpg", b"not a jpeg")
    from PIL import Image

    for name in sorted(os.listdir(data / "1"))[:3]:  # near-duplicates: recompressed copies
        Image.open(data / "1" / name).convert("L").save(data / "1" / f"copy-{name}.jpg", quality=80)
    config = PipelineConfig(root=str(tmp_path / "out"), data=str(data), schema=SAMPLE_SCHEMA)
    with pytest.raises(IngestionError, match="60 of 363 files"):
        local_runner.run(config)
    summary = run_summary.summarize(config.metadata_path)
    assert states(summary) == {"ImageExampleGen": "FAILED"}
    # What it found is still said, and the report made (a KeyError on the near-duplicates list lost both).
    from report import report
    from runs import verdicts

    assert details(summary, "ImageExampleGen")["near_duplicate_groups"] >= 3
    assert any("60 of 363" in line or "quarantined" in line for line in run_text.format_summary(summary))
    assert verdicts.hints(summary, None)[0].startswith("quarantined files, with reasons: ")
    assert os.path.exists(report.build(summary, str(tmp_path / "report.html"), pipeline_name=config.pipeline_name))
    # No half-written examples or report left behind looking complete.
    for output in ("examples", "report"):
        folder = os.path.join(config.pipeline_root, "ImageExampleGen", output)
        assert not os.path.exists(folder) or os.listdir(folder) == []


def test_relabelled_file_invalidates_the_cache(tmp_path, small_digits):
    data = tmp_path / "data"
    shutil.copytree(small_digits, data)
    config = PipelineConfig(root=str(tmp_path / "out"), data=str(data), schema=SAMPLE_SCHEMA)
    run_with_probe(config)
    moved = sorted(os.listdir(data / "7"))[0]
    os.rename(data / "7" / moved, data / "1" / moved)  # same bytes, size and mtime; new label
    summary = run_with_probe(config)
    assert states(summary)["ImageExampleGen"] == "ran"
    assert (
        details(summary, "ImageExampleGen")["examples_per_split_and_class"]["train"]["1"]
        + details(summary, "ImageExampleGen")["examples_per_split_and_class"]["eval"]["1"]
        == 31
    )


def test_predict_command_labels_files_with_the_pushed_model(sample_runs, tmp_path):
    config, _, _ = sample_runs
    digits = config.sample_data_dir
    chosen = {
        label: os.path.join(digits, label, sorted(os.listdir(os.path.join(digits, label)))[-1])
        for label in sorted(os.listdir(digits))
        if not label.startswith(".")
    }
    broken = write(tmp_path / "broken.jpg", b"not an image")
    done = run_imagepipe("predict", "--root", config.root, "--top", "2", *chosen.values(), broken, timeout=300)
    assert done.returncode == 1  # one file could not be classified; the others were
    assert done.stderr.strip().splitlines() == [f"{broken}: error: {done.stderr.split(': error: ', 1)[1].strip()}"]
    lines = dict(line.rsplit(": ", 1) for line in done.stdout.strip().splitlines())
    assert set(lines) == set(chosen.values())
    correct = 0
    for label, path in chosen.items():
        (first, p1), (_, p2) = re.findall(r"(\S+) \((\d\.\d{3})\)", lines[path])
        assert 1 >= float(p1) >= float(p2) >= 0
        correct += first == label
    assert correct >= 9, lines


def test_predict_never_serves_a_version_cut_short(sample_runs, tmp_path):
    """A Pusher killed mid-copy (an older release, or a copy by hand) leaves a newer version with its SavedModel but
    no threshold.json: predict serves the newest whole version, never that one."""
    from components.pusher import PUSH_COMPLETE

    config, first, _ = sample_runs
    pushed = details(first, "Pusher")["destination"]
    serving = tmp_path / "serving"
    shutil.copytree(pushed, serving / "1000")
    cut = serving / "2000"
    shutil.copytree(pushed, cut)
    for name in (PUSH_COMPLETE, "threshold.json"):
        os.remove(cut / name)
    assert predict.resolve_model_dir(str(serving)) == str(serving / "1000")
    os.remove(serving / "1000" / PUSH_COMPLETE)  # a version pushed before the marker: whole by its files
    assert predict.resolve_model_dir(str(serving)) == str(serving / "1000")
    os.remove(serving / "1000" / "threshold.json")
    with pytest.raises(predict.ModelNotFound):
        predict.resolve_model_dir(str(serving))


def test_predict_refuses_what_is_not_an_image_file_and_a_damaged_model(sample_runs, tmp_path):
    config, first, _ = sample_runs
    good = os.path.join(config.sample_data_dir, "3", sorted(os.listdir(os.path.join(config.sample_data_dir, "3")))[0])
    fifo = str(tmp_path / "camera-feed.jpg")
    os.mkfifo(fifo)  # nobody writes to it: reading it would block for ever
    done = run_imagepipe("predict", "--root", config.root, good, fifo, "/dev/zero", timeout=300)
    assert done.returncode == 1 and done.stdout.startswith(f"{good}: 3 (")  # the good file still answered
    refused = "error: unreadable: not a regular file (a folder, pipe or device); not read"
    assert done.stderr.strip().splitlines() == [f"{path}: {refused}" for path in (fifo, "/dev/zero")]
    # A manifest naming files outside its folder: never read (their first bytes were printed in the error).
    write(tmp_path / "secret.txt", b"TOP-SECRET")
    write(tmp_path / "lists" / "good.jpg", open(good, "rb").read())
    write(tmp_path / "lists" / "m.csv", b"path\n/etc/passwd\n../secret.txt\ngood.jpg\n")
    done = run_imagepipe("predict", "--root", config.root, str(tmp_path / "lists" / "m.csv"), timeout=300)
    assert done.returncode == 1 and done.stdout.startswith(f"{tmp_path / 'lists' / 'good.jpg'}: 3 (")
    assert "TOP-SECRET" not in done.stderr and "root:x:0" not in done.stderr
    errors = done.stderr.strip().splitlines()
    assert [e.split(": error: ", 1)[1].split(":")[0] for e in errors] == ["outside_data_root"] * 2, errors
    assert "m.csv line 3: '../secret.txt' resolves outside the data root" in errors[1]
    # Cloud Storage that cannot be reached: one line at once (it was 104 s of retries, then tracebacks).
    offline = dict(os.environ, STORAGE_EMULATOR_HOST="http://127.0.0.1:9")  # nothing listens on port 9
    done = run_imagepipe("predict", "--root", config.root, "gs://no-such-bucket/x.png", env=offline, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "imagepipe: error: gs://no-such-bucket/x.png: cannot reach Cloud Storage at 127.0.0.1:9 (Connection refused); "
        "check the network (or proxy) and try again"
    ]
    os.mkfifo(tmp_path / "feed.csv")  # a manifest that is a pipe: it hung for ever
    done = run_imagepipe("predict", "--root", config.root, str(tmp_path / "feed.csv"), timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"imagepipe: error: {tmp_path / 'feed.csv'}: not a regular file (a named pipe, device or folder), so it is "
        "not read; give a CSV manifest file"
    ]

    damaged = tmp_path / "model"
    shutil.copytree(details(first, "Pusher")["destination"], damaged)
    with open(damaged / "saved_model.pb", "r+b") as f:
        f.truncate(os.path.getsize(damaged / "saved_model.pb") // 2)
    done = run_imagepipe("predict", "--model", str(damaged), good, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"imagepipe: error: --model {damaged}: not a usable SavedModel (")
    assert line.endswith("give a model the pipeline pushed (<root>/serving/<name>) or run 'imagepipe run' again")


def test_predict_streams_folders_and_manifests_into_a_results_file(sample_runs, tmp_path):
    config, _, _ = sample_runs
    digits = config.sample_data_dir
    sevens = sorted(os.listdir(os.path.join(digits, "7")))[:15]
    for n, name in enumerate(sevens):  # a folder, nested, with OS clutter that is not an image
        folder = tmp_path / "photos" / f"day-{n % 2}"
        os.makedirs(folder, exist_ok=True)
        shutil.copy(os.path.join(digits, "7", name), folder / name)
    write(tmp_path / "photos" / ".DS_Store", b"\0\0\0\1Bud1")
    write(tmp_path / "photos" / ".thumbnails" / "t.jpg", image_bytes())
    twos = sorted(os.listdir(os.path.join(digits, "2")))[:5]
    os.makedirs(tmp_path / "twos")
    for name in twos:
        shutil.copy(os.path.join(digits, "2", name), tmp_path / "twos" / name)
    write(
        tmp_path / "list.csv", ("path,label\n" + "".join(f"twos/{n},2\n" for n in twos) + "twos/gone.jpg,2\n").encode()
    )

    out = tmp_path / "results.jsonl"
    done = run_imagepipe(
        "predict",
        "--root",
        config.root,
        "--output",
        str(out),
        str(tmp_path / "photos"),
        str(tmp_path / "list.csv"),
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]  # one manifest row names a missing file
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 11 and lines[-1] == f"21 inputs: 20 classified, 1 failed; results in {out}"
    records = [json.loads(line) for line in open(out)]
    assert [os.path.basename(r["path"]) for r in records[:15]] == sorted(sevens, key=lambda n: (sevens.index(n) % 2, n))
    assert sum(r["predictions"][0]["class"] == "7" for r in records[:15]) >= 14
    assert sum(r["predictions"][0]["class"] == "2" for r in records[15:20]) >= 4
    assert records[20] == {
        "path": str(tmp_path / "twos" / "gone.jpg"),
        "error": "cannot read: No such file or directory",
    }

    table = tmp_path / "results.csv"
    done = run_imagepipe(
        "predict", "--root", config.root, "--output", str(table), "--top", "2", str(tmp_path / "list.csv"), timeout=300
    )
    rows = list(csv.reader(open(table)))
    assert rows[0] == ["path", "class_1", "probability_1", "class_2", "probability_2", "unsure", "error"]
    assert len(rows) == 7 and {r[5] for r in rows[1:-1]} == {"no"}  # the sample's model has no threshold
    assert rows[-1][1:] == ["", "", "", "", "", "cannot read: No such file or directory"]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]

    done = run_imagepipe(
        "predict", "--root", config.root, "--output", str(tmp_path / "r.txt"), str(tmp_path / "list.csv"), timeout=300
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"imagepipe: error: --output {tmp_path / 'r.txt'}: name a .jsonl or .csv file"
    ]


def test_tflite_exports_score_next_to_the_savedmodel_and_classify_files(sample_runs, tmp_path):
    config, first, _ = sample_runs
    trainer, evaluation = details(first, "Trainer"), details(first, "Evaluator")
    record = trainer["tflite"]
    held = trainer["operating_point"]["model_on_held_out"]
    assert record["examples"] == held["images"] == 287 and evaluation["example_count"] == 359
    # The Keras model the child process rebuilt from the saved weights decides as the operating point chose.
    assert record["savedmodel_accuracy"] == pytest.approx(held["chosen"]["accuracy"], abs=1.01 / record["examples"])
    assert set(record["models"]) == {"float16", "int8"}
    assert abs(record["models"]["float16"]["accuracy"] - record["savedmodel_accuracy"]) <= 0.01
    assert abs(record["models"]["int8"]["accuracy"] - record["savedmodel_accuracy"]) <= 0.03
    assert record["models"]["int8"]["bytes"] < record["models"]["float16"]["bytes"]
    line = next(line for line in run_text.format_summary(first) if "Trainer" in line)
    assert f"TFLite float16 {record['models']['float16']['accuracy']:.4f}" in line
    assert f"vs SavedModel {record['savedmodel_accuracy']:.4f} on 287 held-out examples" in line

    pushed = details(first, "Pusher")["destination"]  # the files travel with the pushed model
    with open(os.path.join(pushed, "tflite", "labels.txt")) as f:
        assert f.read().splitlines() == trainer["class_names"]
    interpreter = tf.lite.Interpreter(os.path.join(pushed, "tflite", "model_int8.tflite"))
    (pixels,) = interpreter.get_input_details()  # what an app passes: one image of uint8 pixels
    assert pixels["dtype"] == np.uint8 and list(pixels["shape"]) == [1, 32, 32, 3]

    digits = config.sample_data_dir
    chosen = [
        os.path.join(digits, label, name)
        for label in sorted(os.listdir(digits))
        if not label.startswith(".")
        for name in sorted(os.listdir(os.path.join(digits, label)))[-3:]
    ]
    answers = {}
    for model in (pushed, os.path.join(pushed, "tflite", "model_float16.tflite")):
        out = tmp_path / f"{len(answers)}.jsonl"
        done = run_imagepipe("predict", "--model", model, "--output", str(out), *chosen, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        answers[model] = [json.loads(line)["predictions"][0] for line in open(out)]
    savedmodel, tflite = answers.values()
    assert sum(p["class"] == os.path.basename(os.path.dirname(path)) for p, path in zip(tflite, chosen)) >= 27
    assert sum(a["class"] == b["class"] for a, b in zip(savedmodel, tflite)) >= 29  # float16: the same answers


def test_onnx_and_core_ml_exports_agree_with_the_savedmodel_and_are_listed(sample_runs, tmp_path):
    """The exports where users deploy, checked as a user would: onnxruntime on the pushed model's ONNX file gives
    the SavedModel's top class on at least 99.5% of the eval images (the images decoded and resized by the SavedModel's own
    image_pixels), its probabilities within 1e-4 (measured: 1e-7 here; float sums differ by CPU); the Core ML
    package's spec, read back, takes a 32x32 RGB image and names every class. The card and the summary list them,
    and `imagepipe export` makes either of a pushed model again, never over a user's file, and says in one line
    what it cannot do."""
    import glob as globbing

    import onnxruntime

    from components.model_card import CARD_JSON
    from trainer import model_exports

    config, first, _ = sample_runs
    trainer = details(first, "Trainer")
    record = trainer["exports"]
    assert record["onnx"]["examples"] == 287 and record["onnx"]["agreement"] >= 0.995, record
    pushed = details(first, "Pusher")["destination"]
    examples = next(c for c in first["components"] if c["component"] == "ImageExampleGen")
    files = globbing.glob(os.path.join(examples["outputs"]["examples"][0], "Split-eval", "*"))
    images = [
        tf.train.Example.FromString(r.numpy()).features.feature["image/encoded"].bytes_list.value[0]
        for r in tf.data.TFRecordDataset(files, compression_type="GZIP")
    ]
    assert len(images) == examples["details"]["examples_per_split"]["eval"]
    saved = tf.saved_model.load(pushed)
    probabilities = np.concatenate(
        [
            saved.signatures["serving_default"](image_bytes=tf.constant(images[i : i + 64]))["probabilities"].numpy()
            for i in range(0, len(images), 64)
        ]
    )
    decoded = np.concatenate(
        [saved.image_pixels(tf.constant(images[i : i + 64])).numpy() for i in range(0, len(images), 64)]
    ).astype(np.float32)
    onnx = model_exports.OnnxClassifier(open(os.path.join(pushed, "onnx", "model.onnx"), "rb").read())
    assert onnx.class_names == trainer["class_names"]
    served = onnx.probabilities(decoded)
    assert (served.argmax(1) == probabilities.argmax(1)).mean() >= 0.995
    np.testing.assert_allclose(served, probabilities, atol=1e-4)

    spec = model_exports.describe_coreml(os.path.join(pushed, "coreml", "model.mlpackage"))
    assert spec["input"] == {"name": "pixels", "image": True, "width": 32, "height": 32, "color": "RGB"}
    assert spec["outputs"] == ["classLabel", "classLabel_probs"] and spec["class_names"] == trainer["class_names"]
    card = json.load(open(os.path.join(pushed, CARD_JSON)))
    assert [e["name"] for e in card["exports"]] == ["SavedModel", "TFLite float16", "TFLite int8", "onnx", "coreml"]
    assert card["model"]["framework"]["stack"] == stacks.NAME  # which stack trained it, and its versions
    assert card["model"]["framework"]["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    line = next(line for line in run_text.format_summary(first) if "Trainer" in line)
    assert "ONNX" in line and "top-1 as the SavedModel on" in line and "Core ML" in line

    out = tmp_path / "again.onnx"
    done = run_imagepipe("export", "--root", config.root, "--format", "onnx", "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    again = model_exports.OnnxClassifier(out.read_bytes())
    np.testing.assert_allclose(again.probabilities(decoded[:16]), served[:16], atol=1e-4)
    write(tmp_path / "mine.onnx", b"a file of mine")
    refused = run_imagepipe(
        "export", "--root", config.root, "--format", "onnx", "--out", str(tmp_path / "mine.onnx"), timeout=300
    )
    assert refused.returncode == 2 and "is never overwritten" in refused.stderr
    assert (tmp_path / "mine.onnx").read_bytes() == b"a file of mine"
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixels"]  # the name docs/prediction.md feeds

    package = tmp_path / "new" / "folder" / "model.mlpackage"  # its folders made
    done = run_imagepipe("export", "--root", config.root, "--format", "coreml", "--out", str(package), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert model_exports.describe_coreml(str(package))["class_names"] == trainer["class_names"]
    # made again, the package imagepipe wrote is replaced and a file the user saved in it is kept (only what imagepipe
    # wrote is replaced); a package imagepipe did not write is refused in one line, before any conversion
    write(package / "notes.txt", b"mine")
    done = run_imagepipe("export", "--root", config.root, "--format", "coreml", "--out", str(package), timeout=300)
    assert done.returncode == 0 and (package / "notes.txt").read_bytes() == b"mine", done.stderr[-2000:]
    assert model_exports.describe_coreml(str(package))["class_names"] == trainer["class_names"]
    theirs = tmp_path / "theirs.mlpackage"
    write(theirs / "Manifest.json", b"{}")
    refused = run_imagepipe("export", "--root", config.root, "--format", "coreml", "--out", str(theirs), timeout=300)
    assert refused.returncode == 2 and "files imagepipe did not write" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and "coremltools" not in refused.stderr, refused.stderr
    assert os.listdir(theirs) == ["Manifest.json"] and (theirs / "Manifest.json").read_bytes() == b"{}"
    for argv, said in (
        (["--root", config.root, "--out", "gs://bucket/model.onnx"], "--out gs://bucket/model.onnx: a local path only"),
        (["--model", str(tmp_path / "new"), "--out", str(tmp_path / "x.onnx")], "--model"),
    ):
        refused = run_imagepipe("export", "--format", "onnx", *argv, timeout=300)
        assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


def test_predict_reads_images_in_cloud_storage(sample_runs, tmp_path):
    """gs:// inputs through the real Cloud Storage client (Beam's gs:// file system, as ingestion reads
    them), against a local stand-in of the JSON API (tests/fake_endpoints.py)."""
    config, _, _ = sample_runs
    digits = config.sample_data_dir
    bucket, expected = tmp_path / "bucket", []
    for label in ("4", "6"):
        for name in sorted(os.listdir(os.path.join(digits, label)))[:3]:
            with open(os.path.join(digits, label, name), "rb") as f:
                write(bucket / "incoming" / label / name, f.read())
            expected.append((f"gs://photos-1/incoming/{label}/{name}", label))
    write(bucket / "incoming" / "6" / "notes.jpg", b"not an image")
    write(bucket / "incoming" / ".thumbnails" / "t.jpg", image_bytes())  # hidden: skipped, as ingestion does
    nine = os.path.join(digits, "9", sorted(os.listdir(os.path.join(digits, "9")))[0])
    with open(nine, "rb") as f:
        write(bucket / "lists" / "nine.png", f.read())
    # A manifest in the bucket: an absolute gs:// path, and one relative to the manifest's folder (rows
    # may name files below the manifest's folder only, as in ingestion: the bucket's top here).
    write(bucket / "today.csv", f"path\n{expected[0][0]}\nlists/nine.png\n".encode())
    out = tmp_path / "results.jsonl"
    with FakeService(buckets={"photos-1": str(bucket)}) as gcs:
        done = run_imagepipe(
            "predict",
            "--root",
            config.root,
            "--output",
            str(out),
            "gs://photos-1/incoming",
            "gs://photos-1/today.csv",
            "gs://photos-1/incoming/4/gone.png",
            timeout=600,
            env={
                **os.environ,
                "STORAGE_EMULATOR_HOST": gcs.url,
                "GOOGLE_APPLICATION_CREDENTIALS": gcs.credentials_file(str(tmp_path)),
            },
        )
        downloads = gcs.find("GET", r"^/download/storage/v1/b/photos-1/o/")
    assert done.returncode == 1, done.stderr[-3000:]  # two inputs failed, the others were classified
    records = [json.loads(line) for line in open(out)]
    assert [r["path"] for r in records] == [path for path, _ in expected] + [
        "gs://photos-1/incoming/6/notes.jpg",
        expected[0][0],
        "gs://photos-1/lists/nine.png",
        "gs://photos-1/incoming/4/gone.png",
    ]
    assert sum(r["predictions"][0]["class"] == label for r, (_, label) in zip(records, expected)) >= 5
    assert records[-4]["error"].startswith("not_an_image: ")
    assert records[-3]["predictions"] == records[0]["predictions"] and "predictions" in records[-2]
    assert records[-1]["error"] == "cannot read: No such file or directory"
    assert len(downloads) == 10  # the manifest, and each object it or the folder names, read through the API


def test_batch_prediction_on_beam_workers_matches_the_streamed_results(sample_runs, tmp_path):
    config, first, _ = sample_runs
    digits = config.sample_data_dir
    for label in ("1", "8"):
        shutil.copytree(os.path.join(digits, label), tmp_path / "in" / label)
    write(tmp_path / "in" / "8" / "cut.jpg", image_bytes()[:200])  # truncated: a per-file error row
    write(tmp_path / "in" / "list.csv", b"path\ngone.png\n")  # a manifest naming a missing file
    inputs = [str(tmp_path / "in" / "1"), str(tmp_path / "in" / "8"), str(tmp_path / "in" / "list.csv")]

    streamed, on_beam = tmp_path / "streamed.jsonl", tmp_path / "beam.jsonl"
    run_imagepipe("predict", "--root", config.root, "--top", "3", "--output", str(streamed), *inputs, timeout=300)
    done = run_imagepipe(
        "predict", "--root", config.root, "--top", "3", "--output", str(on_beam), "--workers", "2", *inputs, timeout=600
    )
    total = len(os.listdir(tmp_path / "in" / "1")) + len(os.listdir(tmp_path / "in" / "8")) + 1
    assert done.returncode == 1, done.stderr[-3000:]  # two inputs failed, the rest were classified
    assert done.stdout.strip().splitlines() == [
        f"{total:,} inputs: {total - 2:,} classified, 2 failed; results in {on_beam}"
    ]
    assert "Warning" not in done.stderr and "Traceback" not in done.stderr

    expected = {r["path"]: r for r in map(json.loads, open(streamed))}
    got = {r["path"]: r for r in map(json.loads, open(on_beam))}
    assert set(got) == set(expected) and len(expected) == total
    assert got[str(tmp_path / "in" / "8" / "cut.jpg")]["error"].startswith("truncated: ")
    assert got[str(tmp_path / "in" / "gone.png")]["error"] == "cannot read: No such file or directory"
    for path, record in got.items():  # the same model on the same bytes: the same answers, whatever the batch
        if "error" in record:
            assert record == expected[path]
            continue
        assert [p["class"] for p in record["predictions"]] == [p["class"] for p in expected[path]["predictions"]]
        assert np.allclose(
            [p["probability"] for p in record["predictions"]],
            [p["probability"] for p in expected[path]["predictions"]],
            atol=1e-4,
        )
    assert not [name for name in os.listdir(tmp_path) if name.startswith("beam-temp")]

    done = run_imagepipe("predict", "--root", config.root, "--workers", "2", *inputs, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "imagepipe: error: --workers writes every result to a file: give --output results.jsonl (or .csv)"
    ]

    damaged = tmp_path / "model"  # loaded by the workers: their failure is still one line, and no file is left
    shutil.copytree(details(first, "Pusher")["destination"], damaged)
    with open(damaged / "saved_model.pb", "r+b") as f:
        f.truncate(1000)
    done = run_imagepipe(
        "predict",
        "--model",
        str(damaged),
        "--workers",
        "2",
        "--output",
        str(tmp_path / "never.jsonl"),
        *inputs,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"imagepipe: error: --model {damaged}: not a usable SavedModel (")
    assert not [name for name in os.listdir(tmp_path) if name.startswith(("never", "beam-temp"))]


def test_a_batch_with_an_image_tensorflow_cannot_decode_labels_the_others(sample_runs):
    config, first, _ = sample_runs
    serve = predict.load_serving(details(first, "Pusher")["destination"])
    digits = config.sample_data_dir
    three, five = (
        open(os.path.join(digits, d, sorted(os.listdir(os.path.join(digits, d)))[0]), "rb").read() for d in ("3", "5")
    )
    alone = predict.label_batch(serve, [three, five], top=2)
    labels = predict.label_batch(serve, [three, b"\xff\xd8\xff not really a JPEG", five], top=2)
    assert [label.get("predictions", [("-",)])[0][0] for label in labels] == [
        alone[0]["predictions"][0][0],
        "-",
        alone[1]["predictions"][0][0],
    ]
    assert labels[0]["predictions"][0][0] == "3"
    assert np.allclose([p for _, p in labels[2]["predictions"]], [p for _, p in alone[1]["predictions"]], atol=1e-4)
    assert labels[1] == {"error": labels[1]["error"]} and labels[1]["error"].startswith("undecodable: ")


def _shape(text: str) -> str:
    """A summary line with what varies from run to run made alike: paths, numbers, the device."""
    text = re.sub(r"\S*/\S+", "PATH", text)
    text = re.sub(r"on \w[\w-]* \(\d+ replicas?: [^)]*\)", "on DEVICE", text)
    return re.sub(r"\d[\d,.:]*", "N", text)


def test_the_readme_shows_what_make_run_prints(sample_runs):
    """The README's sample output is what `make run` prints, numbers, paths and the device aside: every
    component in order, each line as the code writes it (it said "lowest eval loss" long after the code did not,
    and left out DataHealth)."""
    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read().splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("    run 20"))
    block = itertools.takewhile(lambda line: line.startswith("      "), readme[start + 1 :])  # the component lines
    shown = [line.strip().split(None, 4) for line in block]
    _, first, _ = sample_runs
    printed = [line.strip().split(None, 4) for line in run_text.format_summary(first)[1:]]
    assert [s[0] for s in shown] == [p[0] for p in printed]
    for s, p in zip(shown, printed):
        text, made = (s[4] if len(s) > 4 else ""), (p[4] if len(p) > 4 else "")
        # The sample run also exports TFLite models: its Trainer line goes on where the README's ends.
        assert _shape(made).startswith(_shape(text)), (s[0], text, made)


def test_no_beam_step_builds_a_tfx_package_for_a_runner_on_this_machine(tmp_path, monkeypatch):
    """Given any Beam argument, TFX's Beam executors build an sdist of TFX (2.4 s, 49 MB in the temporary folder, never
    deleted) for remote workers to install; the DAG's steps build none for Beam's runners here, and keep TFX's
    behaviour for a remote runner (components/beam_dependencies.py)."""
    from tfx.dsl.components.base import base_beam_executor, executor_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where TFX would build the package
    config = PipelineConfig(root=str(tmp_path / "root"), model="mobilenet_v2", tune_trials=2)
    steps = {
        c.id: c.executor_spec.executor_class
        for c in create_pipeline(config, platform.local(config)).components
        if isinstance(c.executor_spec, executor_spec.BeamExecutorSpec)
    }
    assert set(steps) >= {
        "ImageExampleGen",
        "StatisticsGen",
        "Transform",
        "BackboneFeatures",
        "DataHealth",
        "Evaluator",
    }
    before = set(os.listdir(tmp_path))

    def beam_args_of(executor_class, beam_args):
        context = base_beam_executor.BaseBeamExecutor.Context(beam_pipeline_args=beam_args, tmp_dir=str(tmp_path))
        return executor_class(context)._beam_pipeline_args  # pylint: disable=protected-access

    for runner in ([], ["--runner=DirectRunner"], [f"--runner={stacks.LOCAL_BEAM_RUNNER}"]):
        for step, executor_class in steps.items():
            args = beam_args_of(executor_class, ["--direct_num_workers=2", *runner])
            assert not [a for a in args if a.startswith("--extra_package")], (step, runner)
    assert set(os.listdir(tmp_path)) == before
    remote = beam_args_of(steps["StatisticsGen"], ["--runner=DataflowRunner", "--project=p", "--region=r"])
    assert [a for a in remote if a.startswith("--extra_package=")][0].endswith(".tar.gz")
