"""Training on several replicas, machines and devices, run for real where this machine can: MirroredStrategy over
two logical CPU devices, the mixed-precision policy through export, two worker processes on localhost with
TF_CONFIG (MultiWorkerMirroredStrategy) through TFX's own executor entry point, the static-shape (TPU) input
that drops no eval example; and at their boundary what needs a TPU or Vertex AI (the compiled jobs, the image,
an unreachable TPU). No test assumes the machine has or lacks a GPU."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import expected_strategy_kind, model_dir, run_imagepipe

from trainer import features, input_pipeline, strategy
from trainer.hparams import HParams

SIZE = 8


def _write_records(path, labels):
    """Transform-like records (pixels, label) of SIZE x SIZE x 3 images, gzip TFRecords."""
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for n, label in enumerate(labels):
            pixels = np.full((SIZE, SIZE, 3), n % 256, np.uint8).tobytes()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        features.PIXELS_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels])),
                        features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    return path


@pytest.mark.parametrize("count", [387, 1100])
def test_static_batches_drop_no_eval_example_and_the_padding_counts_nowhere(tmp_path, count):
    """On TPU every batch has one shape (XLA). Eval's last batch is padded with examples of weight 0: the digits'
    387 eval images in one batch of 512 (drop_remainder gave none), and the metrics count the real ones only."""
    labels = [0] + [1] * (count - 1)  # the first is copied as padding: class 0
    files = [_write_records(str(tmp_path / "eval.gz"), labels)]
    hp = HParams(model="cnn", image_size=SIZE)
    evaluation = input_pipeline.make_dataset(files, hp, training=False, batching=input_pipeline.Batching(512, True))
    batches = list(evaluation)
    assert len(batches) == -(-count // 512) == int(evaluation.cardinality())
    assert all(x.shape[0] == 512 and w.shape == (512,) for x, _, w in batches)  # one shape for every batch
    weights = np.concatenate([w.numpy() for _, _, w in batches])
    seen = np.concatenate([y.numpy() for _, y, _ in batches])
    assert weights.sum() == count and (seen[weights == 0] == 0).all()

    # A model that calls everything class 0 is right on 1 real example: the padding (class 0) must not count.
    import keras

    from trainer import models

    inputs = keras.Input((SIZE, SIZE, 3))
    flat = keras.layers.Flatten()(inputs)
    probabilities = keras.layers.Dense(2, activation="softmax", name="probabilities")(flat)
    model = keras.Model(inputs, probabilities)
    models.compile_model(model, dataclasses.replace(hp, learning_rate=1e-3))
    model.get_layer("probabilities").set_weights([np.zeros((SIZE * SIZE * 3, 2)), np.array([5.0, 0.0])])
    scores = model.evaluate(evaluation, verbose=0, return_dict=True)
    assert scores["sparse_categorical_accuracy"] == pytest.approx(1 / count, rel=1e-4)
    assert scores["balanced_accuracy"] == pytest.approx(0.5, rel=1e-4)  # class 0 all found, class 1 none

    # Training's batches are whole too: an epoch is every record and then some of the next shuffled pass (the
    # remainder dropped lost a small set's half each epoch); the features' input pads alike.
    train = input_pipeline.make_dataset(files, hp, training=True, batching=input_pipeline.Batching(512, True))
    assert int(train.cardinality()) == -(-count // 512)
    assert all(int(x.shape[0]) == 512 for x, _ in train.take(2))


def test_a_tpu_asked_for_and_unreachable_stops_the_trainer_in_one_line():
    def unreachable():
        raise ValueError("Could not lookup TPU metadata from name 'local'.\nPlease doublecheck the tpu argument")

    with pytest.raises(strategy.TrainingDeviceError) as raised:
        strategy.plan(tpu_resolver=unreachable, gpus=[], required="tpu", environ={})
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--training-tpu: no TPU reachable")
    assert "Could not lookup TPU metadata" in message and "does not fall back to the CPU" in message
    # Not asked for: a warning, and the next best device.
    assert strategy.plan(tpu_resolver=unreachable, gpus=["/gpu:0"], environ={}).kind == "gpu"
    with pytest.raises(ValueError, match="required_device 'gpu'"):
        HParams(required_device="gpu").validate()


def test_a_tpu_name_that_does_not_answer_is_a_warning_and_the_next_device(monkeypatch):
    """docs/training.md promises a warning and the next device for a TPU_NAME that does not answer; TensorFlow's
    resolver raised a URLError (an OSError), which failed the run."""
    monkeypatch.setenv("TPU_NAME", "no-such-tpu.invalid")
    assert strategy.plan(gpus=[], cpus=["/cpu:0"]).kind == "cpu"


def test_a_cluster_tf_config_on_a_local_run_is_one_line_before_it_starts(tmp_path):
    """`imagepipe run` with a TF_CONFIG of two machines failed in the Trainer ("Collective ops must be configured
    at program startup") after ingestion and Transform; a one-machine TF_CONFIG (Vertex sets one) is fine."""
    from pipeline import preflight
    from pipeline.config import ConfigError

    two = {
        "TF_CONFIG": json.dumps(
            {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}
        )
    }
    with pytest.raises(
        ConfigError,
        match=r"^TF_CONFIG names a cluster of 2 training machines, which `imagepipe run` "
        r"cannot train on .*--training-replicas 2",
    ):
        preflight.check_no_cluster(two)
    preflight.check_no_cluster(
        {"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}})}
    )
    preflight.check_no_cluster({})


def test_tf_config_makes_a_multi_worker_plan_and_names_the_chief():
    def config(cluster, task):
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}

    vertex = {
        "chief": ["cmle-training-workerpool0-0:2222"],
        "worker": ["cmle-training-workerpool1-0:2222", "cmle-training-workerpool1-1:2222"],
    }
    chief = strategy.plan(environ=config(vertex, {"type": "chief", "index": 0}), gpus=["/gpu:0"])
    assert (chief.kind, chief.is_chief, chief.mixed_precision_policy) == ("multi-worker", True, "mixed_float16")
    assert chief.devices == ["3 machines", "1 GPU each"]
    worker = strategy.plan(environ=config(vertex, {"type": "worker", "index": 0}), gpus=[])
    assert (worker.kind, worker.is_chief, worker.mixed_precision_policy) == ("multi-worker", False, None)
    # Without a chief task, worker 0 is the chief (TensorFlow's convention).
    workers = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert strategy.plan(environ=config(workers, {"type": "worker", "index": 0}), gpus=[]).is_chief
    assert not strategy.plan(environ=config(workers, {"type": "worker", "index": 1}), gpus=[]).is_chief
    # One machine (Vertex sets TF_CONFIG on a one-replica job too) is not a cluster.
    alone = strategy.plan(environ=config({"chief": ["host:2222"]}, {"type": "chief", "index": 0}), gpus=[], cpus=["c"])
    assert alone.kind == "cpu" and alone.is_chief
    with pytest.raises(strategy.TrainingDeviceError, match="^TF_CONFIG is not a cluster spec"):
        strategy.plan(environ={"TF_CONFIG": "{not json"}, gpus=[])
    assert strategy.plan(environ={}, gpus=[], cpus=["/cpu:0", "/cpu:1"]).kind == "multi-cpu"


def test_a_tuner_trial_trains_on_one_machine_whatever_tf_config_says(monkeypatch):
    """The Vertex Tuner extension's replicas run parallel trials: TF_CONFIG names them, but each trial trains
    alone (a multi-worker strategy would wait for the others' collectives)."""
    from trainer import search as tuning

    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}),
    )
    assert strategy.plan(gpus=[]).kind == "multi-worker"  # the Trainer would train across them
    assert tuning.trial_plan(HParams()).kind == expected_strategy_kind()


@pytest.fixture(scope="module")
def replica_runs(tmp_path_factory, small_digits):
    """`imagepipe run` twice on the small digits, as users start it: across 2 logical CPU devices
    (--cpu-replicas 2), and with the mixed-precision policy on and a TFLite export. One root: the second run takes
    ingestion, statistics, Transform and data health from the first's cache (what is tested starts at the Trainer)."""
    runs = {}
    root = str(tmp_path_factory.mktemp("replicas"))
    for name, extra in (
        ("replicas", ["--cpu-replicas", "2"]),
        ("mixed", ["--mixed-precision", "on", "--tflite", "float16"]),
    ):
        done = run_imagepipe(
            "run",
            "--root",
            root,
            "--data",
            small_digits,
            "--epochs",
            "8",
            "--progress",
            "quiet",
            "--accuracy-threshold",
            "0",
            "--min-class-recall",
            "0",
            "--explanations",
            "0",  # nothing here reads them
            *extra,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = {"root": root, "summary": _summary(root, small_digits)}
    return runs


def _summary(root, data):
    from pipeline.config import PipelineConfig
    from runs import run_summary

    return run_summary.summarize(PipelineConfig(root=root, data=data).metadata_path)


def _details(summary, component):
    return next(c["details"] for c in summary["components"] if c["component"] == component)


def _training(summary):
    model_run = _details(summary, "Trainer")["model_run"]
    with open(os.path.join(model_run, "training.json")) as f:
        return json.load(f)


def test_mirrored_strategy_over_two_logical_cpu_devices_trains_end_to_end(replica_runs):
    summary = replica_runs["replicas"]["summary"]
    record = _training(summary)
    kind = expected_strategy_kind()
    if kind == "cpu":  # the CPU split in two; a machine with accelerators trains on them instead
        assert (record["device_kind"], record["replicas"]) == ("multi-cpu", 2)
        assert record["strategy"].startswith("multi-cpu (2 replicas: ")
    else:
        assert record["device_kind"] == kind
    assert record["hparams"]["batch_size"] == 64  # per replica: the global batch is 64 x replicas
    evaluation = _details(summary, "Evaluator")
    eval_images = sum(_details(summary, "ImageExampleGen")["examples_per_split_and_class"]["eval"].values())
    assert evaluation["example_count"] == eval_images  # every eval example counted
    # In the single-replica range: the mixed run trained one replica on the same data and settings.
    single = _details(replica_runs["mixed"]["summary"], "Evaluator")["accuracy"]
    assert evaluation["accuracy"] >= 0.6 and abs(evaluation["accuracy"] - single) <= 0.25


def test_mixed_precision_trains_through_export_with_float32_probabilities(replica_runs, small_digits):
    summary = replica_runs["mixed"]["summary"]
    record = _training(summary)
    assert record["hparams"]["mixed_precision"] == "on"
    policy = {"cpu": "mixed_bfloat16", "tpu": "mixed_bfloat16"}.get(expected_strategy_kind(), "mixed_float16")
    assert record["strategy"].endswith(policy)
    serving = tf.saved_model.load(os.path.join(model_dir(summary), "Format-Serving"))
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(small_digits) for f in fs if not f.startswith("."))
    images = [open(path, "rb").read() for path in files[::37]]
    probabilities = serving.signatures["serving_default"](image_bytes=tf.constant(images))["probabilities"]
    assert probabilities.dtype == tf.float32 and probabilities.shape == (len(images), 10)
    assert np.allclose(probabilities.numpy().sum(axis=1), 1.0, rtol=1e-3)
    tflite = record["tflite"]
    assert abs(tflite["models"]["float16"]["accuracy"] - tflite["savedmodel_accuracy"]) <= 0.02


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_worker_processes_train_one_model_with_multi_worker_mirrored_strategy(replica_runs, small_digits, tmp_path):
    """The Trainer as each replica of a Vertex AI Training job runs it (TFX's run_executor with the Trainer's
    inputs, outputs and properties), in two processes with TF_CONFIG naming a chief and a worker on localhost:
    they train together, and only the chief writes the model, the logs and training.json."""
    from tfx.types import artifact_utils, standard_artifacts
    from tfx.utils import proto_utils

    from pipeline import platform, preflight
    from pipeline.config import PipelineConfig
    from pipeline.pipeline import create_pipeline

    root = replica_runs["replicas"]["root"]
    config = PipelineConfig(root=root, data=small_digits, epochs=8, accuracy_threshold=0.0, min_class_recall=0.0)
    config = preflight.preflight(config).config  # --model auto resolved, as the runner does
    trainer = next(c for c in create_pipeline(config, platform.local(config)).components if c.id == "Trainer")
    properties = {
        k: proto_utils.proto_to_json(v) if hasattr(v, "DESCRIPTOR") else v
        for k, v in trainer.exec_properties.items()
        if v is not None
    }
    transform = os.path.join(root, "pipelines", config.pipeline_name, "Transform")
    examples = standard_artifacts.Examples()
    examples.uri = _only(os.path.join(transform, "transformed_examples"))
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    graph = standard_artifacts.TransformGraph()
    graph.uri = _only(os.path.join(transform, "transform_graph"))
    model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
    model.uri, model_run.uri = str(tmp_path / "model"), str(tmp_path / "model_run")
    command = [
        sys.executable,
        "-m",
        "tfx.scripts.run_executor",
        "--executor_class_path",
        "components.trainer.component.TrainerExecutor",
        "--inputs",
        artifact_utils.jsonify_artifact_dict({"examples": [examples], "transform_graph": [graph]}),
        "--outputs",
        artifact_utils.jsonify_artifact_dict({"model": [model], "model_run": [model_run]}),
        "--exec-properties",
        json.dumps(properties, sort_keys=True),
    ]
    cluster = {"chief": [f"127.0.0.1:{_free_port()}"], "worker": [f"127.0.0.1:{_free_port()}"]}
    processes, logs = {}, {kind: tmp_path / f"{kind}.log" for kind in ("chief", "worker")}  # whole, for a traceback
    try:
        for kind, log in logs.items():
            env = {
                **os.environ,
                "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}}),
                "CUDA_VISIBLE_DEVICES": "",
            }  # two processes on one machine: neither takes a GPU from the other
            with open(log, "w") as out:
                processes[kind] = subprocess.Popen(
                    command,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                )
        deadline = time.monotonic() + 900
        # Until both end; one that fails ends the test at once (the other would wait for it, up to hours).
        while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in processes.values()):
                break
            time.sleep(1)
    finally:
        for p in processes.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = [logs[kind].read_text() for kind in ("chief", "worker")]
    codes = {kind: p.returncode for kind, p in processes.items()}  # a negative one: killed after the other failed
    failed = [kind for kind, code in codes.items() if code and code > 0] or [k for k, c in codes.items() if c]
    lines = logs[failed[0]].read_text().splitlines() if failed else []
    assert not failed, (
        f"{codes}; see {logs[failed[0]]}: "
        + "\n".join(line for line in lines if "Error" in line or line.startswith("  File"))[-3000:]
    )
    with open(os.path.join(model_run.uri, "training.json")) as f:
        record = json.load(f)
    assert (record["device_kind"], record["replicas"], record["workers"]) == ("multi-worker", 2, 2)
    assert sorted(os.listdir(model.uri)) == ["Format-Serving", "keras"]  # one model, the chief's
    assert os.path.exists(os.path.join(model.uri, "Format-Serving", "saved_model.pb"))
    assert "waits for the chief's model" in outputs[1]
    # In the single-machine range: the last kept held-out accuracy against the one-process runs'.
    best = max(e["val_sparse_categorical_accuracy"] for e in record["epochs"])
    single = max(e["val_sparse_categorical_accuracy"] for e in _training(replica_runs["mixed"]["summary"])["epochs"])
    assert best >= 0.6 and abs(best - single) <= 0.25


def _only(folder):
    (name,) = os.listdir(folder)
    return os.path.join(folder, name)


_WORKER_INPUT = """
import json, sys
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other TensorFlow op
from trainer import input_pipeline
from trainer.hparams import HParams
cases, out = json.loads(sys.argv[1]), sys.argv[2]
hp = HParams(model="cnn", image_size=8, batch_size=8, seed=1)
batch = hp.batch_size * strategy.num_replicas_in_sync
seen = {}
for case, files in cases.items():  # one cluster for every case: its processes start once
    train, steps = input_pipeline.repeated(input_pipeline.make_dataset(files, hp, training=True, batching=input_pipeline.Batching(batch)))
    train = input_pipeline.sharded_across_workers(train, input_pipeline.list_files(files), 2, training=True)
    evaluation = input_pipeline.sharded_across_workers(
        input_pipeline.make_dataset(files, hp, training=False, batching=input_pipeline.Batching(batch)), [], 2, training=False)
    seen[case] = {"train": [], "eval": []}
    batches = iter(strategy.experimental_distribute_dataset(train))
    for _ in range(steps):
        seen[case]["train"] += [int(v) for t in strategy.experimental_local_results(next(batches)[1]) for v in t.numpy()]
    for _, labels in strategy.experimental_distribute_dataset(evaluation):
        seen[case]["eval"] += [int(v) for t in strategy.experimental_local_results(labels) for v in t.numpy()]
json.dump(seen, open(out, "w"))
"""


def test_two_workers_read_their_own_files_and_every_example_once(tmp_path):
    """MultiWorkerMirroredStrategy across two processes on localhost, through the Trainer's input functions: with
    as many files as workers (4 here), an epoch of training has each worker read only its own files (the input is
    read once in all, not once a worker), every record once; with one file (Transform's usual output) the workers
    split the batches instead. Either way evaluation counts every example once."""
    per_file = 24
    cases = {
        "4": [
            _write_records(str(tmp_path / f"train-{k}.gz"), range(k * per_file, (k + 1) * per_file)) for k in range(4)
        ],
        "1": [_write_records(str(tmp_path / "train.gz"), range(96))],
    }
    cluster = {"chief": [f"127.0.0.1:{_free_port()}"], "worker": [f"127.0.0.1:{_free_port()}"]}
    processes = {}
    for kind in ("chief", "worker"):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}}),
            "CUDA_VISIBLE_DEVICES": "",
        }
        processes[kind] = subprocess.Popen(
            [sys.executable, "-c", _WORKER_INPUT, json.dumps(cases), str(tmp_path / f"{kind}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=os.path.dirname(os.path.dirname(__file__)),
        )
    outputs = {kind: p.communicate(timeout=300)[0].decode(errors="replace") for kind, p in processes.items()}
    assert all(p.returncode == 0 for p in processes.values()), {k: o[-2000:] for k, o in outputs.items()}
    seen = {kind: json.load(open(tmp_path / f"{kind}.json")) for kind in processes}
    everything = set(range(96))
    for case in cases:
        trained = [seen[kind][case]["train"] for kind in processes]
        assert sorted(trained[0] + trained[1]) == sorted(everything), case  # an epoch: every record once, in all
        evaluated = [seen[kind][case]["eval"] for kind in processes]
        assert sorted(evaluated[0] + evaluated[1]) == sorted(everything), case
        if case == "4":  # each worker's records are whole files of its own
            of_files = [{label // per_file for label in labels} for labels in trained]
            assert len(of_files[0]) == len(of_files[1]) == 2 and not of_files[0] & of_files[1]


def test_files_are_split_across_workers_only_in_even_shares(tmp_path):
    """Sharding by file only when each worker's share of the records is about the same: else a worker with less
    data would repeat its records each epoch while another's go partly unseen."""
    alike = [_write_records(str(tmp_path / f"alike-{k}.gz"), [0] * 50) for k in range(4)]
    assert input_pipeline.even_files(alike, 2) and input_pipeline.even_files(alike, 4)
    assert not input_pipeline.even_files(alike[:3], 2)  # 2 files and 1: one worker reads twice the other's
    assert not input_pipeline.even_files(alike[:1], 2)  # fewer files than workers
    lopsided = alike[:3] + [_write_records(str(tmp_path / "big.gz"), [0] * 200)]
    assert not input_pipeline.even_files(lopsided, 2)
