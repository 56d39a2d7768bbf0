"""Vertex AI and Kubeflow Pipelines, tested at their boundaries: the compiled specs parsed with kfp's
protos, the real TFX CLI, the real client libraries against local fake endpoints, and
ImageExampleGen's pre-cache driver run as the Vertex container runs it."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import tensorflow_data_validation as tfdv
import yaml
from commands import run_tfx, warm_interpreter
from conftest import image_bytes, make_class_tree, write
from fake_endpoints import FakeService
from google.auth.credentials import AnonymousCredentials
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from cli.main import main as cli_main
from kubeflow import deploy
from pipeline.cloud_config import CloudConfig
from pipeline.config import PROJECT_DIR, SAMPLE_SCHEMA, ConfigError, PipelineConfig

IMAGE = "us-central1-docker.pkg.dev/proj-1/imagepipe/pipeline:v7"
DATA = "gs://bucket-1/images"
ROOT = "gs://bucket-1/pipelines"
ORDER = [
    "ImageExampleGen",
    "StatisticsGen",
    "ExampleValidator",
    "DataValidationGate",
    "Transform",
    "DataHealth",
    "DataHealthGate",
    "Trainer",
    "Evaluator",
    "Pusher",
]


def production(tune_trials: int = 0, **changes):
    config = PipelineConfig(name="imagepipe", data=DATA, schema=SAMPLE_SCHEMA, tune_trials=tune_trials).validate()
    cloud = CloudConfig(
        project="proj-1",
        region="europe-west4",
        pipeline_root=ROOT,
        image=IMAGE,
        service_account="runner@proj-1.iam.gserviceaccount.com",
        **changes,
    ).validate(config)
    return config, cloud


@pytest.fixture(scope="module")
def vertex_job(tmp_path_factory):
    config, cloud = production(
        dataflow=True,
        vertex_training=True,
        training_accelerator="NVIDIA_TESLA_T4",
        training_accelerator_count=2,
        parallel_trials=3,
        tune_trials=4,
    )
    path = deploy.compile_pipeline(config, cloud, str(tmp_path_factory.mktemp("vertex") / "job.json"))
    text = open(path).read()
    job = json_format.Parse(text, pipeline_spec_pb2.PipelineJob())
    return text, job, json_format.MessageToDict(job.pipeline_spec)


def _task_text(spec, name):
    return json.dumps(spec["root"]["dag"]["tasks"][name])


def _executor(spec, name):
    key = spec["root"]["dag"]["tasks"][name]["componentRef"]["name"]
    executor = spec["components"][key]["executorLabel"]
    return spec["deploymentSpec"]["executors"][executor]


def test_vertex_spec_has_every_component_in_order(vertex_job):
    _, job, spec = vertex_job
    tasks = spec["root"]["dag"]["tasks"]
    assert set(ORDER) <= set(tasks) and "ImportSchemaGen" in tasks
    upstream = {name: set(task.get("dependentTasks", [])) for name, task in tasks.items()}
    assert "ImageExampleGen" in upstream["StatisticsGen"]
    assert "DataValidationGate" in upstream["Transform"]  # nothing consumes data before the gate passes
    assert {"Transform", "DataHealthGate"} <= upstream["Trainer"]  # no training on data that failed its health check
    assert {"Trainer", "latest_blessed_model_resolver-model-resolver"} <= upstream["Evaluator"]
    assert "Evaluator" in upstream["Pusher"]
    assert job.runtime_config.gcs_output_directory == f"{ROOT}/imagepipe"


def test_vertex_spec_runs_this_projects_code_in_the_image(vertex_job):
    _, _, spec = vertex_job
    for name in ORDER:
        assert _executor(spec, name)["container"]["image"] == IMAGE, name
    example_gen = _executor(spec, "ImageExampleGen")["container"]
    assert "components.example_gen.executor.Executor" in example_gen["args"]
    assert example_gen["lifecycle"]["preCacheCheck"]["command"] == list(
        ("python", "-m", "components.example_gen.vertex_driver")
    )
    assert (
        "components.validation.gate.DataValidationGate_Executor"
        in _executor(spec, "DataValidationGate")["container"]["args"]
    )
    # TFX's data components run with byte-bounded Beam batches (components/beam_settings.py) there too,
    # and StatisticsGen knows image/encoded as image bytes (no top-k shuffle of every image).
    for name, executor in (
        ("StatisticsGen", "components.validation.statistics.StatisticsGenExecutor"),
        ("Transform", "components.transform.executor.TransformExecutor"),
    ):
        assert executor in _executor(spec, name)["container"]["args"], name
    assert "components.evaluator.executor.Executor" in _executor(spec, "Evaluator")["container"]["args"]
    # The gate's drift reference: the latest blessed model's blessing, from the resolver Vertex runs.
    blessing = spec["root"]["dag"]["tasks"]["DataValidationGate"]["inputs"]["artifacts"]["baseline_blessing"]
    assert blessing["taskOutputArtifact"]["producerTask"] == "latest_blessed_model_resolver-model-blessing-resolver"
    parameters = json.loads(_task_text(spec, "StatisticsGen"))["inputs"]["parameters"]
    options = tfdv.StatsOptions.from_json(
        parameters["stats_options_json"]["runtimeValue"]["constantValue"]["stringValue"]
    )
    encoded = next(f for f in options.schema.feature if f.name == "image/encoded")
    assert encoded.WhichOneof("domain_info") == "image_domain"
    assert "components.transform.preprocessing.preprocessing_fn" in _task_text(spec, "Transform")
    assert "trainer.task.run_fn" in _task_text(spec, "Trainer")
    # The curated schema is read from the image, where ./Dockerfile copies the repository.
    assert "/pipeline/schemas/digits/schema.pbtxt" in _task_text(spec, "ImportSchemaGen")


def test_vertex_spec_sends_data_components_to_dataflow(vertex_job):
    _, _, spec = vertex_job
    for name in ("ImageExampleGen", "StatisticsGen", "Transform", "Evaluator"):
        args = _executor(spec, name)["container"]["args"]
        assert "--runner=DataflowRunner" in args, name
        assert {
            "--project=proj-1",
            "--region=europe-west4",
            f"--sdk_container_image={IMAGE}",
            f"--temp_location={ROOT}/imagepipe/tmp",
        } <= set(args), name


def test_vertex_spec_trains_on_vertex_ai_with_accelerators(vertex_job):
    _, _, spec = vertex_job
    trainer = _executor(spec, "Trainer")["container"]
    # TFX's Vertex Trainer executor, which first writes the runtime parameters into custom_config
    assert "components.trainer.component.VertexTrainerExecutor" in trainer["args"]
    parameter = json.loads(_task_text(spec, "Trainer"))["inputs"]["parameters"]["custom_config"]["runtimeValue"]
    config_json = json.loads(parameter["constantValue"]["stringValue"])
    pool = config_json["ai_platform_training_args"]["job_spec"]["worker_pool_specs"][0]
    assert pool["machine_spec"] == {
        "machine_type": "n1-standard-8",
        "accelerator_type": "NVIDIA_TESLA_T4",
        "accelerator_count": 2,
    }
    assert pool["container_spec"]["image_uri"] == IMAGE
    assert config_json["ai_platform_vertex_region"] == "europe-west4"
    assert config_json["epochs"] == PipelineConfig().epochs  # the hyperparameters travel with it


def _trainer_config(spec, task="Trainer"):
    parameter = json.loads(_task_text(spec, task))["inputs"]["parameters"]["custom_config"]["runtimeValue"]
    return json.loads(parameter["constantValue"]["stringValue"])


def test_training_replicas_compile_a_chief_and_workers_alike(tmp_path):
    """--training-replicas 3: Vertex AI Training runs a chief and 2 workers of the same machine and image (Vertex
    sets TF_CONFIG on each; trainer/strategy.py trains across them); a trial of the Tuner keeps one machine."""
    config, cloud = production(
        vertex_training=True, training_accelerator="NVIDIA_L4", training_replicas=3, tune_trials=4, parallel_trials=2
    )
    spec = json_format.MessageToDict(
        json_format.Parse(
            open(deploy.compile_pipeline(config, cloud, str(tmp_path / "job.json"))).read(),
            pipeline_spec_pb2.PipelineJob(),
        ).pipeline_spec
    )
    chief, workers = _trainer_config(spec)["ai_platform_training_args"]["job_spec"]["worker_pool_specs"]
    machine = {"machine_type": "n1-standard-8", "accelerator_type": "NVIDIA_L4", "accelerator_count": 1}
    assert (chief["replica_count"], workers["replica_count"]) == (1, 2)
    assert chief["machine_spec"] == workers["machine_spec"] == machine
    assert chief["container_spec"] == workers["container_spec"] == {"image_uri": IMAGE}
    trials = _trainer_config(spec, "Tuner")["ai_platform_tuning_args"]["job_spec"]["worker_pool_specs"]
    assert len(trials) == 1 and trials[0]["replica_count"] == 1 and trials[0]["machine_spec"] == machine
    assert _trainer_config(spec)["required_device"] == ""  # any device: no TPU was asked for


def test_a_tpu_job_runs_the_tpu_image_and_must_find_its_tpu(tmp_path):
    """--training-tpu: the Trainer's job runs the TPU build of the image (--training-image), and the Trainer is
    told a TPU was asked for: without one it stops (trainer/strategy.py) instead of training on the CPU."""
    from trainer.hparams import HParams

    tpu_image = IMAGE.replace("pipeline:", "pipeline-tpu:")
    config, cloud = production(vertex_training=True, training_tpu="TPU_V3", training_image=tpu_image)
    spec = json_format.MessageToDict(
        json_format.Parse(
            open(deploy.compile_pipeline(config, cloud, str(tmp_path / "job.json"))).read(),
            pipeline_spec_pb2.PipelineJob(),
        ).pipeline_spec
    )
    trainer = _trainer_config(spec)
    (pool,) = trainer["ai_platform_training_args"]["job_spec"]["worker_pool_specs"]
    assert pool["machine_spec"] == {"machine_type": "cloud-tpu", "accelerator_type": "TPU_V3", "accelerator_count": 8}
    assert pool["container_spec"] == {"image_uri": tpu_image}
    assert HParams.from_custom_config(trainer).required_device == "tpu"


def _locked(stack: str, package: str) -> str:
    """The version of `package` that stacks/<stack>.lock pins."""
    lock = open(os.path.join(PROJECT_DIR, "stacks", f"{stack}.lock")).read()
    return re.search(rf"^{re.escape(package)}==(\S+)", lock, re.M)[1]


def test_the_tpu_build_of_the_image_swaps_in_tensorflow_s_tpu_build_of_the_locked_version():
    """./Dockerfile with --build-arg ACCELERATOR=tpu: TensorFlow's TPU build of the version the legacy lock has, and
    the libtpu that build requires (tensorflow-tpu 2.16.x: libtpu==2.16.0rc0, from Google's libtpu-releases index,
    PyPI has no such version), in place of the plain TensorFlow; the default build is untouched. The modern stack has
    none (tensorflow-tpu stops at 2.20): that build is refused in one line, naming the way out."""
    steps = _dockerfile(os.path.join(PROJECT_DIR, "Dockerfile"))
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG")
    assert args["ACCELERATOR"] == "cpu"
    assert args["TPU_TENSORFLOW"] == f"tensorflow-tpu=={_locked('legacy', 'tensorflow')}"
    assert _locked("modern", "tensorflow").startswith("2.21.")
    assert args["LIBTPU"] == "libtpu==2.16.0rc0"
    assert args["LIBTPU_INDEX"] == "https://storage.googleapis.com/libtpu-releases/index.html"
    (swap,) = [a for kind, a in steps if kind == "RUN" and "ACCELERATOR" in a]
    assert '[ "$ACCELERATOR" = "tpu" ]' in swap and "uv pip uninstall --system tensorflow" in swap
    refusal = re.search(r'"\$STACK" != "legacy" \];\s+then\s+echo "([^"]+)" && exit 1', swap)
    assert refusal and "no TPU build of 2.21" in refusal[1] and "--build-arg STACK=legacy" in refusal[1]
    assert '--no-deps "$TPU_TENSORFLOW" "$LIBTPU" --find-links "$LIBTPU_INDEX"' in swap and "import libtpu" in swap
    assert [kind for kind, _ in steps].index("RUN") < [s for s in steps].index(("RUN", swap))  # after the lock


def test_vertex_spec_tunes_as_a_vertex_ai_training_job_of_parallel_trials(vertex_job):
    """--tune with --vertex-training: the Tuner step is TFX's Vertex Tuner extension (not CloudTuner), its trials
    on the Trainer's machines, three at once; the Trainer takes its best values, and it finds the last search."""
    _, _, spec = vertex_job
    assert "components.tuner.executor.Executor" in _executor(spec, "Tuner")["container"]["args"]
    task = json.loads(_task_text(spec, "Tuner"))
    parameters = task["inputs"]["parameters"]
    constant = lambda name: parameters[name]["runtimeValue"]["constantValue"]["stringValue"]  # noqa: E731
    custom_config = json.loads(constant("custom_config"))
    pool = custom_config["ai_platform_tuning_args"]["job_spec"]["worker_pool_specs"][0]
    assert pool["machine_spec"] == {
        "machine_type": "n1-standard-8",
        "accelerator_type": "NVIDIA_TESLA_T4",
        "accelerator_count": 2,
    }
    assert pool["container_spec"]["image_uri"] == IMAGE and custom_config["ai_platform_enable_vertex"] is True
    assert custom_config["remote_trials_working_dir"] == f"{ROOT}/imagepipe/tuner"
    assert json.loads(constant("tune_args")) == {"num_parallel_trials": 3}
    assert constant("tuner_fn") == "trainer.search.tuner_fn" and constant("tune_mode") == "auto"  # searches when needed
    assert parameters["tune_trials"] == {"componentInputParameter": "tune_trials"}
    assert task["inputs"]["artifacts"]["previous"]["taskOutputArtifact"]["producerTask"] == "latest_search_resolver"
    trainer = spec["root"]["dag"]["tasks"]["Trainer"]["inputs"]["artifacts"]["hyperparameters"]
    assert trainer["taskOutputArtifact"] == {"producerTask": "Tuner", "outputArtifactKey": "best_hyperparameters"}


def test_the_settings_a_scheduled_run_changes_are_pipeline_parameters(vertex_job):
    _, job, spec = vertex_job
    declared = spec["root"]["inputDefinitions"]["parameters"]
    assert set(declared) == {
        "epochs",
        "learning_rate",
        "accuracy_threshold",
        "min_class_recall",
        "tune_trials",
    }  # no --span-pattern
    values = json_format.MessageToDict(job.runtime_config)["parameters"]
    assert values == {
        "epochs": {"intValue": str(PipelineConfig().epochs)},
        "learning_rate": {"doubleValue": PipelineConfig().learning_rate},
        "accuracy_threshold": {"doubleValue": PipelineConfig().accuracy_threshold},
        "min_class_recall": {"doubleValue": PipelineConfig().min_class_recall},
        "tune_trials": {"intValue": "4"},
    }
    tasks = spec["root"]["dag"]["tasks"]
    for task, name in (
        ("Trainer", "epochs"),
        ("Trainer", "learning_rate"),
        ("Evaluator", "accuracy_threshold"),
        ("Evaluator", "min_class_recall"),
        ("Tuner", "epochs"),
    ):
        assert tasks[task]["inputs"]["parameters"][name] == {"componentInputParameter": name}, (task, name)
    config, cloud = production()
    spans = deploy.build_job(dataclasses.replace(config, span_pattern="span-{SPAN}", span_window=2), cloud)
    spans = spans["pipelineSpec"]
    assert spans["root"]["dag"]["tasks"]["ImageExampleGen"]["inputs"]["parameters"]["span_window"] == {
        "componentInputParameter": "span_window"
    }


def test_no_local_path_leaks_into_the_vertex_spec(vertex_job):
    text, _, _ = vertex_job
    for local in {PROJECT_DIR, os.getcwd(), os.path.expanduser("~"), "/tmp/"}:
        assert local not in text.replace(f"{ROOT}", ""), local


def test_dataflow_batch_prediction_is_a_job_on_the_pipeline_image():
    """`imagepipe predict --dataflow`: the Beam job as DataflowRunner builds it (--dry_run: nothing sent)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, WorkerOptions

    from kubeflow.cloud_platform import dataflow_args
    from prediction import batch_predict

    config, cloud = production(dataflow_max_workers=5)
    model, output = "gs://bucket-1/pipelines/imagepipe/serving/7", "gs://bucket-1/predictions/new.jsonl"
    temp = batch_predict.check_dataflow(cloud, config, model, output, ["gs://bucket-1/incoming"])
    assert temp == "gs://bucket-1/pipelines/imagepipe/tmp"  # the pipeline's own Dataflow temp folder

    p = beam.Pipeline(options=PipelineOptions(dataflow_args(config, cloud) + ["--dry_run=True", "--no_auth"]))
    batch_predict.build(p, f"{temp}/inputs.jsonl", batch_predict.Job(model, output, 3, config.max_pixels))
    job = p.run().job
    workers, gcp = job.options.view_as(WorkerOptions), job.options.view_as(GoogleCloudOptions)
    assert (workers.sdk_container_image, workers.max_num_workers) == (IMAGE, 5)
    assert (gcp.project, gcp.region, gcp.service_account_email) == ("proj-1", "europe-west4", cloud.service_account)
    assert gcp.temp_location.startswith(temp + "/")
    environments = [e.payload for e in job.proto_pipeline.components.environments.values()]
    assert environments and all(IMAGE.encode() in payload for payload in environments)  # workers run the image
    names = {t.unique_name for t in job.proto_pipeline.components.transforms.values()}
    assert {"ReadImage", "Classify/BeamML_RunInference", "Write"} <= names


def test_kubeflow_package_is_what_kfp_client_reads(tmp_path):
    config = PipelineConfig(name="imagepipe", data=DATA, schema=SAMPLE_SCHEMA, span_pattern="span-{SPAN}").validate()
    cloud = CloudConfig(target="kubeflow", pipeline_root=ROOT, image=IMAGE, kfp_host="http://kfp.local").validate(
        config
    )
    path = deploy.compile_pipeline(config, cloud, str(tmp_path / "pipeline.yaml"))
    package = yaml.safe_load(open(path))
    spec = json_format.ParseDict(package, pipeline_spec_pb2.PipelineSpec())
    assert spec.default_pipeline_root == f"{ROOT}/imagepipe"
    assert set(ORDER) <= set(spec.root.dag.tasks)
    # What Kubeflow's open-source backend cannot run is left out: resolver nodes (no baseline
    # comparison there) and Vertex's pre-cache driver hook (ImageExampleGen resolves spans itself,
    # and is never cached, so it sees every new span).
    assert not [t for t in spec.root.dag.tasks if "resolver" in t]
    executors = package["deploymentSpec"]["executors"]  # a Struct in the proto: read the YAML
    assert executors and not [name for name, e in executors.items() if "lifecycle" in e.get("container", {})]
    assert not spec.root.dag.tasks["ImageExampleGen"].caching_options.enable_cache
    from kfp.client import client as kfp_client

    assert kfp_client._extract_pipeline_yaml(path).pipeline_spec == spec  # the loader kfp.Client uses


def test_real_tfx_cli_compiles_the_vertex_runner_file(tmp_path):
    env = dict(
        os.environ,
        IMAGEPIPE_NAME="imagepipe",
        IMAGEPIPE_PROJECT="proj-1",
        IMAGEPIPE_PIPELINE_ROOT=ROOT,
        IMAGEPIPE_IMAGE=IMAGE,
        IMAGEPIPE_DATA=DATA,
        IMAGEPIPE_OUTPUT="compiled.json",
        TF_CPP_MIN_LOG_LEVEL="3",
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    result = run_tfx(
        "pipeline",
        "compile",
        "--engine=vertex",
        f"--pipeline_path={PROJECT_DIR}/kubeflow/vertex_runner.py",
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Pipeline imagepipe compiled successfully" in result.stdout
    job = json_format.Parse(open(tmp_path / "compiled.json").read(), pipeline_spec_pb2.PipelineJob())
    assert set(ORDER) <= set(job.pipeline_spec["root"]["dag"]["tasks"])


@pytest.mark.parametrize(
    "config_changes, message",
    [
        ({"name": "My_Pipeline"}, "--name 'My_Pipeline': Vertex AI and Kubeflow need lower-case letters"),
        ({"model": "mobilenet_v2", "weights": "/home/me/w.h5"}, "a local file is not in the pipeline's containers"),
    ],
)
def test_settings_that_only_fail_remotely_fail_before_compiling(config_changes, message):
    config = PipelineConfig(data=DATA, **config_changes)
    with pytest.raises(ConfigError, match=message):
        CloudConfig(project="proj-1", pipeline_root=ROOT, image=IMAGE).validate(config)


def test_weights_in_cloud_storage_reach_the_trainer_of_a_cloud_run():
    weights = "gs://bucket/w/mobilenet_v2_notop.weights.h5"
    config = PipelineConfig(name="imagepipe", data=DATA, model="mobilenet_v2", weights=weights).validate()
    cloud = CloudConfig(project="proj-1", pipeline_root=ROOT, image=IMAGE).validate(config)
    parameters = deploy.build_job(config, cloud)["pipelineSpec"]["root"]["dag"]["tasks"]["Trainer"]["inputs"][
        "parameters"
    ]
    hparams = json.loads(parameters["custom_config"]["runtimeValue"]["constantValue"]["stringValue"])
    assert hparams["weights"] == weights and hparams["model"] == "mobilenet_v2"


def test_kubeflow_cannot_warm_start():
    with pytest.raises(ConfigError, match="--warm-start needs the latest blessed model"):
        CloudConfig(target="kubeflow", pipeline_root=ROOT, image=IMAGE).validate(
            PipelineConfig(data=DATA, warm_start=True)
        )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"cron": "0 3 * * 7"}, "'7' is not valid for the day of week field (0-6)"),
        ({"project": None}, "no GCP project: give --project"),
        ({"pipeline_root": "/home/me/root"}, "Vertex AI needs a gs:// location"),
        ({"image": None}, "give --image URI"),
        ({"cron": "0 25 * * *"}, "'25' is not valid for the hour field (0-23)"),
        ({"cron": "every monday"}, "use 5 fields"),
        ({"training_tpu": "TPU_V3"}, "apply to --vertex-training"),
        ({"training_replicas": 2}, "--training-replicas/--training-image apply to --vertex-training"),
        ({"vertex_training": True, "training_replicas": 0}, "--training-replicas 0: use 1 to 64 machines"),
        (
            {"vertex_training": True, "training_tpu": "TPU_V3"},
            "--training-tpu needs the TPU build of the pipeline image",
        ),
        (
            {"vertex_training": True, "training_tpu": "TPU_V3", "training_image": IMAGE, "training_replicas": 2},
            "--training-tpu with --training-replicas",
        ),
        # Accelerators Vertex would refuse only at the Trainer, after ingestion and Transform:
        (
            {"vertex_training": True, "training_tpu": "TPU_V99", "training_image": IMAGE},
            "--training-tpu 'TPU_V99': use one of TPU_V2, TPU_V3",
        ),
        (
            {"vertex_training": True, "training_accelerator": "NVIDIA_TESLA_T4", "training_accelerator_count": 0},
            "--training-accelerator-count 0: Vertex AI attaches 1, 2, 4, 8, 16 GPUs",
        ),
        (
            {"vertex_training": True, "training_accelerator": "GTX_1080"},
            "--training-accelerator 'GTX_1080': use one of",
        ),
        # Accepted as they were, into job specs, requests and Dataflow command lines:
        ({"pipeline_root": "gs://"}, "--pipeline-root 'gs://': not a Cloud Storage path"),
        ({"project": 'p"; rm -rf /'}, """--project 'p"; rm -rf /': not a valid GCP project ID"""),
        ({"region": "../../x"}, "--region '../../x': not a valid GCP region"),
        ({"image": "i ; echo"}, "--image 'i ; echo': not a valid container image reference"),
        ({"service_account": "pipelines"}, "--service-account 'pipelines': not a valid service account email"),
    ],
)
def test_bad_production_settings_fail_before_compiling(changes, message):
    config = PipelineConfig(data=DATA).validate()
    settings = dict(project="proj-1", pipeline_root=ROOT, image=IMAGE, **{})
    settings.update(changes)
    with pytest.raises(ConfigError) as caught:
        CloudConfig(**settings).validate(config)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_each_step_of_the_compiled_job_has_its_machine_and_the_heavy_beam_steps_their_workers(vertex_job):
    """Every step that touches per-image data asks Vertex AI Pipelines for its machine (ImageExampleGen's too, which
    TFX's compiler leaves out), and on Dataflow the features step and the Evaluator get larger workers: the last
    --machine_type of a step's arguments is the one Beam takes."""
    from kubeflow.cloud_platform import DATAFLOW_STEP_ARGS, STEP_MACHINES

    _, _, spec = vertex_job
    tasks = spec["root"]["dag"]["tasks"]
    for name, machine in STEP_MACHINES.items():
        if name not in tasks:
            continue
        container = _executor(spec, name)["container"]
        assert container["resources"]["cpuLimit"] == machine.cpus, name
        assert container["resources"]["memoryLimit"] == machine.memory_gb, name
        machine_types = [a for a in container.get("args", []) if a.startswith("--machine_type=")]
        expected = DATAFLOW_STEP_ARGS.get(name, ["--machine_type=n1-standard-4"])[-1]
        assert machine_types and machine_types[-1] == expected, (name, machine_types)
    assert {"ImageExampleGen", "Transform", "DataHealth", "Evaluator"} <= set(tasks) & set(STEP_MACHINES)


def test_the_accelerators_accepted_are_vertex_ai_s():
    from google.cloud.aiplatform_v1.types import AcceleratorType

    from pipeline.cloud_config import GPU_TYPES, TPU_TYPES

    assert set(GPU_TYPES + TPU_TYPES) <= set(AcceleratorType.__members__)


def test_local_data_cannot_be_compiled_for_vertex():
    with pytest.raises(ConfigError, match="give --data gs://BUCKET/PATH"):
        CloudConfig(project="proj-1", pipeline_root=ROOT, image=IMAGE).validate(PipelineConfig())


def test_no_cache_reaches_the_service(monkeypatch):
    with FakeService() as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.url)
        fake.serve_resource_manager(monkeypatch)
        config = PipelineConfig(data=DATA, schema=SAMPLE_SCHEMA, enable_cache=False).validate()
        cloud = CloudConfig(project="proj-1", pipeline_root=ROOT, image=IMAGE, api_endpoint=fake.url).validate(config)
        deploy.submit(config, cloud, credentials=AnonymousCredentials())
        (job,) = fake.find("POST", r"/pipelineJobs$")
    tasks = job["body"]["pipelineSpec"]["root"]["dag"]["tasks"]
    assert all(task.get("cachingOptions", {}).get("enableCache", False) is False for task in tasks.values())


def test_an_existing_schedule_is_not_duplicated(monkeypatch):
    with FakeService(existing_schedules=["imagepipe-retraining"]) as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.url)
        config, cloud = production(api_endpoint=fake.url, cron="0 3 * * 1")
        with pytest.raises(deploy.ScheduleExists, match="'imagepipe-retraining' already exists"):
            deploy.schedule(config, cloud, credentials=AnonymousCredentials())
        config, cloud = production(target="kubeflow", kfp_host=fake.url, cron="0 3 * * 1")
        with pytest.raises(deploy.ScheduleExists, match="already exists"):
            deploy.schedule(config, cloud)
        assert not fake.find("POST", r"schedules$|recurringruns$")


def test_vertex_submit_and_schedule_through_the_real_client(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the compiled job is written for the client
    with FakeService() as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.url)  # the bucket check aiplatform makes
        fake.serve_resource_manager(monkeypatch)
        config, cloud = production(api_endpoint=fake.url, cron="30 2 * * 1-5")
        submitted = deploy.submit(config, cloud, credentials=AnonymousCredentials())
        scheduled = deploy.schedule(config, cloud, credentials=AnonymousCredentials())
        (job,) = fake.find("POST", r"^/v1/projects/proj-1/locations/europe-west4/pipelineJobs$")
        (schedule,) = fake.find("POST", r"^/v1/projects/proj-1/locations/europe-west4/schedules$")
        assert fake.find("GET", r"^/v3/projects/proj-1$")  # the bucket's owner was checked, and matched
    assert "Error when trying to get or create a GCS bucket" not in caplog.text
    body = job["body"]
    assert body["displayName"] == "imagepipe"
    assert body["serviceAccount"] == "runner@proj-1.iam.gserviceaccount.com"
    assert body["runtimeConfig"]["gcsOutputDirectory"] == f"{ROOT}/imagepipe"
    assert set(ORDER) <= set(body["pipelineSpec"]["root"]["dag"]["tasks"])
    assert submitted["run"].startswith("projects/proj-1/locations/europe-west4/pipelineJobs/")
    assert schedule["body"]["cron"] == "30 2 * * 1-5"
    assert schedule["body"]["maxConcurrentRunCount"] == "1"
    request = schedule["body"]["createPipelineJobRequest"]["pipelineJob"]
    assert request["serviceAccount"] == "runner@proj-1.iam.gserviceaccount.com"
    assert scheduled["schedule_resource"] == "projects/proj-1/locations/europe-west4/schedules/123"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("imagepipe-")]  # removed once sent


def test_runtime_parameter_values_reach_the_service_and_bad_ones_stop_before_it(monkeypatch, capsys):
    """`imagepipe submit --param epochs=20`: the values go in the request (no recompiling); an unknown name, a
    value out of range or a parameter the job lacks is one line, and nothing is sent."""
    from pipeline.runtime_parameters import runtime_values

    with FakeService() as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.url)
        fake.serve_resource_manager(monkeypatch)
        config, cloud = production(api_endpoint=fake.url, tune_trials=5)
        values = runtime_values(config, ["epochs=20", "learning_rate=0.003", "tune_trials=8"])
        request = deploy.submit(config, cloud, credentials=AnonymousCredentials(), parameters=values)
        (job,) = fake.find("POST", r"/pipelineJobs$")
        assert request["parameters"] == "epochs=20, learning_rate=0.003, tune_trials=8"
        sent = job["body"]["runtimeConfig"]
        given = {k: v for k, v in (sent.get("parameterValues") or sent.get("parameters")).items()}
        assert given["epochs"] in (20, {"intValue": "20"}) and given["tune_trials"] in (8, {"intValue": "8"})
        assert given["learning_rate"] in (0.003, {"doubleValue": 0.003})
        base = [
            "submit",
            "--project",
            "proj-1",
            "--pipeline-root",
            ROOT,
            "--image",
            IMAGE,
            "--data",
            DATA,
            "--api-endpoint",
            fake.url,
        ]
        for params, message in (
            (["epochs=0"], "--param epochs=0: use a whole number from 1 to 10,000"),
            (["epochs=ten"], "--param epochs='ten': not a whole number"),
            (["batch=2"], "--param 'batch=2': use NAME=VALUE, NAME one of epochs, learning_rate, accuracy_threshold"),
            (["tune_trials=3"], "--param tune_trials: this job has no such parameter (compile it with --tune N)"),
            (["accuracy_threshold=2"], "--param accuracy_threshold=2: use a fraction from 0 to 1"),
        ):
            code = cli_main(base + [arg for p in params for arg in ("--param", p)])
            err = capsys.readouterr().err
            assert code == 2 and message in err and err.count("\n") == 1, err
        assert len(fake.find("POST", r"/pipelineJobs$")) == 1  # only the good request was sent


def test_kubeflow_submit_and_schedule_through_the_real_client(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the compiled package is written for the client
    with FakeService() as fake:
        config, cloud = production(
            target="kubeflow", kfp_host=fake.url, cron="0 3 * * 1", k8s_service_account="pipeline-runner"
        )
        deploy.submit(config, cloud, parameters={"epochs": 7})
        deploy.schedule(config, cloud)
        (run,) = fake.find("POST", r"^/apis/v2beta1/runs$")
        (recurring,) = fake.find("POST", r"^/apis/v2beta1/recurringruns$")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("imagepipe-")]  # removed once sent
    assert set(ORDER) <= set(run["body"]["pipeline_spec"]["root"]["dag"]["tasks"])
    assert run["body"]["runtime_config"]["pipeline_root"] == f"{ROOT}/imagepipe"
    assert run["body"]["runtime_config"]["parameters"] == {"epochs": 7}
    # kfp.Client reads the parameters' values from the spec's defaults when a run gives none
    defaults = recurring["body"]["pipeline_spec"]["root"]["inputDefinitions"]["parameters"]
    assert defaults["epochs"]["defaultValue"] == PipelineConfig().epochs
    trigger = recurring["body"]["trigger"]["cron_schedule"]
    assert trigger["cron"] == "0 0 3 * * 1"  # Kubeflow's cron has a leading seconds field
    assert int(recurring["body"]["max_concurrency"]) == 1 and recurring["body"]["no_catchup"] is True
    assert recurring["body"]["service_account"] == "pipeline-runner"  # a Kubernetes service account there


def test_schedule_dry_run_prints_the_request_and_sends_nothing(capsys):
    code = cli_main(
        [
            "schedule",
            "--dry-run",
            "--cron",
            "0 3 * * 1",
            "--project",
            "proj-1",
            "--pipeline-root",
            ROOT,
            "--image",
            IMAGE,
            "--data",
            DATA,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "would schedule (dry run, nothing sent)" in out
    assert "cron: 0 3 * * 1" in out and "where: projects/proj-1/locations/us-central1" in out


def test_schedule_with_a_bad_cron_is_one_line(capsys):
    code = cli_main(
        [
            "schedule",
            "--cron",
            "61 * * * *",
            "--project",
            "proj-1",
            "--pipeline-root",
            ROOT,
            "--image",
            IMAGE,
            "--data",
            DATA,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'61' is not valid for the minute field" in err[0]


def _driver_output(tmp_path, data_root, pattern, span_window=1):
    """Runs the pre-cache driver's entry point with an ExecutorInput naming the span pattern (in this
    process, for speed: test_compiled_vertex_job_runs_offline_task_by_task runs it as Vertex does)."""
    from components.example_gen import vertex_driver

    window = (
        {"span_window": {"intValue": str(span_window)}, "span_pattern": {"stringValue": pattern}}
        if span_window > 1
        else {}
    )
    executor_input = {
        # Pipeline spec 2.0 (what KubeflowV2DagRunner compiles by default) passes "parameters".
        "inputs": {
            "parameters": {
                "input_base": {"stringValue": str(data_root)},
                "input_config": {"stringValue": json.dumps({"splits": [{"name": "single_split", "pattern": pattern}]})},
                "output_config": {"stringValue": "{}"},
                "output_data_format": {"intValue": "6"},
                "output_file_format": {"intValue": "5"},
                **window,
            }
        },
        "outputs": {
            "artifacts": {
                "examples": {
                    "artifacts": [
                        {"name": "examples", "uri": str(tmp_path / "examples"), "type": {"schemaTitle": "tfx.Examples"}}
                    ]
                }
            },
            "outputFile": str(tmp_path / "executor_output.json"),
        },
    }
    processor = vertex_driver.tfx_driver.input_processor.FileBasedInputProcessor
    try:  # main() swaps TFX's input processor for the window-aware one (its process does nothing else)
        vertex_driver.main(
            vertex_driver.tfx_driver._parse_flags(
                ["vertex_driver", "--json_serialized_invocation_args", json.dumps(executor_input)]
            )
        )
    finally:
        vertex_driver.tfx_driver.input_processor.FileBasedInputProcessor = processor
    return json.load(open(tmp_path / "executor_output.json"))["parameterValues"]


def test_vertex_driver_resolves_the_latest_span_and_sees_new_files_in_it(tmp_path):
    data = tmp_path / "drops"
    make_class_tree(data / "span-1", per_class=2)
    make_class_tree(data / "span-2", per_class=2, seed=1)
    first = _driver_output(tmp_path, data, "span-{SPAN}")
    assert first["span"] == 2 and json.loads(first["input_config"])["splits"][0]["pattern"] == "span-2"
    assert _driver_output(tmp_path, data, "span-{SPAN}")["input_fingerprint"] == first["input_fingerprint"]
    write(data / "span-2" / "cat" / "late-arrival.jpg", image_bytes(seed=77))  # same span folder
    assert _driver_output(tmp_path, data, "span-{SPAN}")["input_fingerprint"] != first["input_fingerprint"]


def test_vertex_driver_fingerprints_every_span_of_the_window(tmp_path):
    data = tmp_path / "drops"
    make_class_tree(data / "span-1", per_class=2)
    make_class_tree(data / "span-2", per_class=2, seed=1)
    first = _driver_output(tmp_path, data, "span-{SPAN}", span_window=2)
    assert first["span"] == 2 and first["input_fingerprint"].startswith("layout:folders,files:8,")
    old = data / "span-1" / sorted(os.listdir(data / "span-1"))[0]
    path = old / sorted(os.listdir(old))[0]
    write(path, image_bytes(seed=99))  # the older span of the window, rewritten
    os.utime(path, (1, 1))
    assert (
        _driver_output(tmp_path, data, "span-{SPAN}", span_window=2)["input_fingerprint"] != first["input_fingerprint"]
    )


def test_vertex_driver_sees_images_behind_a_manifest(tmp_path):
    data = tmp_path / "data"
    made = make_class_tree(data / "images", per_class=2)
    write(
        data / "labels.csv", ("path,label\n" + "".join(f"images/{p},{label}\n" for p, label in made.items())).encode()
    )
    first = _driver_output(tmp_path, data, "labels.csv")["input_fingerprint"]
    path = data / "images" / sorted(made)[0]
    write(path, image_bytes(seed=123))  # same name, new content
    os.utime(path, (1, 1))
    assert _driver_output(tmp_path, data, "labels.csv")["input_fingerprint"] != first


def _dockerfile(path):
    """[(INSTRUCTION, arguments)] with continued lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", open(path).read())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [tuple(line.split(None, 1)) for line in lines]


def _project_modules(spec):
    """Every module of this project that the compiled job's containers import or run."""
    names = set()
    for executor in spec["deploymentSpec"]["executors"].values():
        container = executor.get("container", {})
        for step in (container, container.get("lifecycle", {}).get("preCacheCheck", {})):
            args = step.get("command", []) + step.get("args", [])
            names.update(args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m")
            names.update(args[i + 1].rsplit(".", 1)[0] for i, a in enumerate(args[:-1]) if a == "--executor_class_path")
    for task in spec["root"]["dag"]["tasks"].values():
        for key in ("run_fn", "preprocessing_fn", "tuner_fn"):
            value = task.get("inputs", {}).get("parameters", {}).get(key)
            if value:
                names.add(value["runtimeValue"]["constantValue"]["stringValue"].rsplit(".", 1)[0])
    return sorted(n for n in names if n.split(".")[0] in ("components", "trainer", "pipeline"))


def test_the_image_holds_and_imports_what_the_compiled_job_runs(vertex_job):
    """./Dockerfile, read instruction by instruction against the compiled job and this tree."""
    import fnmatch

    from pipeline.cloud_config import IMAGE_PROJECT_DIR

    steps = _dockerfile(os.path.join(PROJECT_DIR, "Dockerfile"))
    kinds = [kind for kind, _ in steps]
    # The modern stack by default, the legacy one by --build-arg STACK=legacy: each stack's base, with its lock.
    assert steps[0] == ("ARG", "STACK=modern")
    bases = dict(reversed(args.split(" AS ")) for kind, args in steps if kind == "FROM" and " AS " in args)
    assert bases["legacy-base"] == f"tensorflow/tfx:{_locked('legacy', 'tfx')}"  # the TFX the legacy lock has
    assert re.fullmatch(r"python:3\.1[23]-slim-trixie", bases["modern-base"])  # Debian 13: glibc 2.41
    assert ("FROM", "${STACK}-base") in steps
    assert ("WORKDIR", IMAGE_PROJECT_DIR) in steps and ("ENV", f"PYTHONPATH={IMAGE_PROJECT_DIR}") in steps
    runs = [args for kind, args in steps if kind == "RUN"]
    uv_version = re.search(r"^UV_VERSION := (\S+)$", open(os.path.join(PROJECT_DIR, "Makefile")).read(), re.M)[1]
    assert f"uv=={uv_version}" in runs[0] and "-r ${STACK}.lock" in runs[0]  # the Makefile's installer, the lock
    # The lock is installed before the project is copied (a code change does not reinstall TFX).
    assert kinds.index("COPY") < kinds.index("RUN") and steps[kinds.index("COPY")][1].startswith("stacks/${STACK}.lock")
    assert ("COPY", ". .") in steps[kinds.index("RUN") :]

    _, _, spec = vertex_job
    modules = _project_modules(spec)
    assert "components.example_gen.vertex_driver" in modules and "trainer.task" in modules
    ignored = [p.strip() for p in open(os.path.join(PROJECT_DIR, ".dockerignore")) if p.strip()]
    for module in modules:  # in the build context, and not left out of it
        path = module.replace(".", "/") + ".py"
        assert os.path.exists(os.path.join(PROJECT_DIR, path)), module
        assert not any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in ignored), module
    # The build's own smoke test imports every one of them (a broken import fails the build, not a run),
    # and passes here, on the same lock.
    imports = re.search(r'python -c "(import [^"]+)"', " ".join(runs))[1]
    assert set(re.findall(r"[\w.]+", imports.removeprefix("import"))) >= set(modules)
    done = subprocess.run([sys.executable, "-c", imports], cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow  # every task of the job as a process of its own (about 2 minutes)
def test_compiled_vertex_job_runs_offline_task_by_task(tmp_path, small_digits):
    """The compiled PipelineJob, executed here as Vertex's launcher would (tests/vertex_offline.py):
    a run (with a search of 2 trials, and runtime parameters given as `--param` gives them) that pushes a
    blessed model, then a run on data with a class the schema lacks, which the validation gate stops after
    comparing it with the first run's blessed model."""
    from vertex_offline import OfflineVertex, TaskFailed

    # The pretrained backbone (a compiled job's --model auto: its ImageNet weights come installed in the image),
    # so the features step runs too; the thresholds given at run time are 0 because 3 epochs on 32 px digits
    # through a backbone made for photos may not reach the compiled 0.9 and every class's recall of 0.5.
    # No explanations: nothing here reads them (tests/test_explanations.py does).
    config = PipelineConfig(
        name="imagepipe", data=DATA, schema=SAMPLE_SCHEMA, epochs=30, image_size=32, tune_trials=2, explanations=0
    ).validate()
    cloud = CloudConfig(project="proj-1", region="europe-west4", pipeline_root=ROOT, image=IMAGE).validate(config)
    job = deploy.compile_pipeline(config, cloud, str(tmp_path / "job.json"))
    vertex = OfflineVertex(str(tmp_path / "vertex"), warm_interpreter("pipeline"))  # run_imagepipe's
    root = str(tmp_path / "bucket" / "pipelines")

    outputs = vertex.run(
        job,
        {DATA: small_digits, ROOT: root},
        parameters={"accuracy_threshold": 0.0, "min_class_recall": 0.0, "epochs": 3},
    )
    assert set(outputs) == set(json.loads(open(job).read())["pipelineSpec"]["root"]["dag"]["tasks"])
    (results,) = outputs["Tuner"]["tuner_results"]  # the search ran in the task (no --vertex-training)
    search = json.load(open(os.path.join(results["uri"], "tuning.json")))
    assert (
        search["searched"] and len(search["results"]) == 2 and search["reason"] == "no earlier search in this pipeline"
    )
    (model_run,) = outputs["Trainer"]["model_run"]
    log = json.load(open(os.path.join(model_run["uri"], "training.json")))
    assert log["hparams"]["epochs"] == 3 and log["tuned"] == search["best"]  # the run's parameter, the search's values
    (examples,) = outputs["ImageExampleGen"]["examples"]
    assert json.loads(examples["metadata"]["split_names"]) == ["train", "eval"]
    assert outputs["latest_blessed_model_resolver-model-resolver"]["model"] == []  # nothing blessed before
    (blessing,) = outputs["Evaluator"]["blessing"]
    assert blessing["metadata"]["blessed"] == 1
    (model,) = outputs["Trainer"]["model"]
    assert blessing["metadata"]["current_model_id"] == model["name"]  # what the next run's resolver follows
    (features,) = outputs["BackboneFeatures"]["features"]  # cached under the pipeline root, shared by pipelines
    (fingerprint,) = set(os.listdir(os.path.join(root, "cache", "features"))) - {"sources"}  # sources/: notes
    assert json.load(open(os.path.join(features["uri"], "summary.json")))["computed"] == 300
    weights = json.load(open(os.path.join(features["uri"], "source.json")))["backbone_weights"]
    assert weights == os.path.join(features["uri"], "backbone.weights.h5")  # in the artifact: a copy of the cache's
    cached = os.path.join(root, "cache", "features", fingerprint, "backbone.weights.h5")
    assert open(weights, "rb").read() == open(cached, "rb").read()
    (pushed,) = outputs["Pusher"]["pushed_model"]
    assert pushed["metadata"]["pushed"] == 1
    destination = pushed["metadata"]["pushed_destination"]
    assert destination.startswith(os.path.join(root, "imagepipe", "serving"))
    import tensorflow as tf

    serve = tf.saved_model.load(destination).signatures["serving_default"]
    label = sorted(os.listdir(small_digits))[3]
    image = open(os.path.join(small_digits, label, sorted(os.listdir(os.path.join(small_digits, label)))[0]), "rb")
    assert serve(image_bytes=tf.constant([image.read()]))["probabilities"].shape == (1, 10)

    drifted = tmp_path / "drifted"
    shutil.copytree(small_digits, drifted)
    for n in range(12):  # a class the curated schema does not know
        write(drifted / "letter-x" / f"x-{n}.png", image_bytes("PNG", size=(32, 32), mode="L", seed=n))
    with pytest.raises(TaskFailed) as stopped:
        vertex.run(job, {DATA: str(drifted), ROOT: root})
    assert stopped.value.task == "DataValidationGate" and "letter-x" in str(stopped.value)
    ran = stopped.value.outputs
    assert ran["latest_blessed_model_resolver-model-blessing-resolver"]["model_blessing"] == [blessing]
    assert not {"Transform", "Trainer", "Evaluator", "Pusher"} & set(ran)


def _cli(*args):
    """The real `tfx` CLI (TFX's click group, as its console script runs it), in this process: its Vertex client
    talks to the stand-in that aiplatform was pointed at."""
    from click.testing import CliRunner
    from tfx.tools.cli import cli_main

    return CliRunner().invoke(cli_main.cli_group, list(args), catch_exceptions=False)


def test_the_tfx_cli_creates_updates_and_starts_the_pipeline_on_vertex(monkeypatch, tmp_path):
    """docs/cloud.md's TFX CLI path against the local Vertex stand-in: `tfx pipeline create` (twice: the second
    says to update), `tfx pipeline update`, `tfx run create --runtime_parameter`, `tfx run list`. What the service
    receives: the job, its runtime parameters, and its first task (RunCheck), which checks them and the account;
    what the TFX CLI cannot send (a service account, labels) is said in the docs, and RunCheck stops a run
    started without the account."""
    from google.cloud import aiplatform

    settings = {
        "PROJECT": "proj-1",
        "REGION": "europe-west4",
        "PIPELINE_ROOT": ROOT,
        "IMAGE": IMAGE,
        "DATA": DATA,
        "NAME": "pets",
        "SCHEMA": SAMPLE_SCHEMA,
        "SERVICE_ACCOUNT": "runner@proj-1.iam.gserviceaccount.com",
    }
    for key, value in settings.items():
        monkeypatch.setenv(f"IMAGEPIPE_{key}", value)
    monkeypatch.setenv("VERTEX_HOME", str(tmp_path / "tfx-home"))  # where the TFX CLI keeps created pipelines
    # Its vertex engine looks for kfp in `pip freeze` from PATH: this environment's.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.chdir(PROJECT_DIR)
    create = ["pipeline", "create", "--engine=vertex", "--pipeline_path=kubeflow/vertex_runner.py"]
    with FakeService() as fake:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.url)
        fake.serve_resource_manager(monkeypatch)
        # The stand-in as Vertex's endpoint: the CLI's own aiplatform.init(project, location) keeps it.
        aiplatform.init(api_endpoint=fake.url, api_transport="rest", credentials=AnonymousCredentials())
        try:
            done = _cli(*create)
            assert done.exit_code == 0 and 'Pipeline "pets" created successfully.' in done.output, done.output
            again = _cli(*create)
            assert again.exit_code != 0 and "already exists" in again.output  # docs/cloud.md: then update
            updated = _cli("pipeline", "update", "--engine=vertex", "--pipeline_path=kubeflow/vertex_runner.py")
            assert updated.exit_code == 0 and 'Pipeline "pets" updated successfully.' in updated.output
            started = _cli(
                "run",
                "create",
                "--engine=vertex",
                "--project",
                "proj-1",
                "--region",
                "europe-west4",
                "--pipeline_name",
                "pets",
                "--runtime_parameter",
                "epochs=20",
                "--runtime_parameter",
                "learning_rate=0.003",
            )
            assert started.exit_code == 0 and "Run created for pipeline: pets" in started.output, started.output
            listed = _cli("run", "list", "--engine=vertex", "--pipeline_name", "pets")
            assert "Not supported for vertex orchestrator" in listed.output  # docs/cloud.md: the console or gcloud
            bad = _cli(
                "run",
                "create",
                "--engine=vertex",
                "--project",
                "proj-1",
                "--region",
                "europe-west4",
                "--pipeline_name",
                "pets",
                "--runtime_parameter",
                "epochs=0",
            )
            assert bad.exit_code == 0  # the TFX CLI sends a value out of range: the job's first task stops it
            # A bad setting in the runner file's environment is one line, not the TFX CLI's traceback around it.
            for variable, value, message in (
                ("EPOCHS", "abc", "IMAGEPIPE_EPOCHS='abc': not a whole number"),
                ("DATA", "/local/images", "upload the images and give --data gs://"),
                ("TRAINING_REPLICAS", "0", "--training-replicas 0: use 1 to 64"),
            ):
                with monkeypatch.context() as bad_setting:
                    bad_setting.setenv(f"IMAGEPIPE_{variable}", value)
                    if variable == "TRAINING_REPLICAS":
                        bad_setting.setenv("IMAGEPIPE_VERTEX_TRAINING", "1")
                    refused = _cli("pipeline", "update", "--engine=vertex", "--pipeline_path=kubeflow/vertex_runner.py")
                lines = [line for line in refused.output.splitlines() if line.strip()]
                assert refused.exit_code != 0 and lines[-1].startswith("imagepipe: error: "), refused.output
                assert message in lines[-1] and "Traceback" not in refused.output, refused.output
        finally:
            aiplatform.init(api_endpoint=None)
            aiplatform.initializer.global_config._api_endpoint = None  # noqa: SLF001 - other tests' clients
    job, sent_bad = fake.find("POST", r"^/v1/projects/proj-1/locations/europe-west4/pipelineJobs$")
    body = job["body"]
    parameters = body["runtimeConfig"]["parameters"]
    assert parameters["epochs"] == {"intValue": "20"} and parameters["learning_rate"] == {"doubleValue": 0.003}
    # What the TFX CLI does not send: the account (the job would run as the default compute account) and labels.
    assert "serviceAccount" not in body and "pipeline" not in body.get("labels", {})
    tasks = body["pipelineSpec"]["root"]["dag"]["tasks"]
    assert tasks["ImageExampleGen"]["dependentTasks"] == ["RunCheck"]
    assert tasks["RunCheck"]["cachingOptions"] == {"enableCache": False}  # a cached check would check no account
    check = tasks["RunCheck"]["inputs"]["parameters"]
    assert check["epochs"] == {"componentInputParameter": "epochs"}
    assert check["service_account"]["runtimeValue"]["constantValue"]["stringValue"] == settings["SERVICE_ACCOUNT"]

    # The run with epochs=0, as Vertex would run the job the service received (tests/vertex_offline.py): its first
    # task stops it at once, in one line, before any other task.
    from vertex_offline import OfflineVertex, TaskFailed

    received = tmp_path / "received.json"
    received.write_text(json.dumps(sent_bad["body"]))
    with pytest.raises(TaskFailed) as failed:
        OfflineVertex(str(tmp_path / "vertex"), warm_interpreter("pipeline")).run(
            str(received), {ROOT: str(tmp_path / "root"), DATA: str(tmp_path / "data")}
        )
    assert failed.value.task == "RunCheck" and not failed.value.outputs
    assert str(failed.value).endswith("runtime parameter epochs=0: use a whole number from 1 to 10,000; nothing ran")


def test_the_first_task_stops_a_bad_runtime_value_or_the_wrong_account_in_one_line(tmp_path):
    """RunCheck, the compiled job's first task, run as Vertex runs it (tests/vertex_offline.py): a value that
    `tfx run create` sent unchecked, or a run executing as another account than the one compiled in (what the
    run's GCE metadata server says), fails it at once in one line, and no other task runs."""
    from vertex_offline import OfflineVertex, TaskFailed

    config, cloud = production()
    job = deploy.compile_pipeline(config, cloud, str(tmp_path / "job.json"))
    vertex = OfflineVertex(str(tmp_path / "vertex"), warm_interpreter("pipeline"))
    paths = {ROOT: str(tmp_path / "root"), DATA: str(tmp_path / "data")}
    with pytest.raises(TaskFailed) as failed:
        vertex.run(job, paths, parameters={"epochs": 0})
    assert failed.value.task == "RunCheck" and not failed.value.outputs
    assert str(failed.value) == (
        "RunCheck failed: pipeline.run_check.RunSettingsError: runtime parameter epochs=0: "
        "use a whole number from 1 to 10,000; nothing ran"
    )
    with pytest.raises(TaskFailed) as failed:  # started without the account: as the default compute account
        vertex.run(job, paths, parameters={"epochs": 20}, service_account="123-compute@developer.gserviceaccount.com")
    assert failed.value.task == "RunCheck"
    message = str(failed.value)
    assert (
        "this run executes as 123-compute@developer.gserviceaccount.com, not runner@proj-1.iam.gserviceaccount.com"
        in message
        and "`tfx run create` cannot pass one" in message
        and "\n" not in message
    )


def test_tfx_build_image_builds_the_project_s_dockerfile(monkeypatch):
    """`tfx pipeline create --build_image` builds ./Dockerfile of the folder it runs in (the project root), and
    writes TFX's own default (FROM tensorflow/tfx, COPY ./, without the lock) only when there is none. What its
    builder would build, without Docker: the file it picks, unchanged, is the project's."""
    from tfx.tools.cli.container_builder import dockerfile, labels

    monkeypatch.chdir(PROJECT_DIR)
    path = os.path.join(labels.BUILD_CONTEXT, labels.DOCKERFILE_NAME)  # what builder.build() passes to Docker
    before = open(path).read()
    dockerfile.Dockerfile(filename=path)  # the builder's first step: generate a Dockerfile if none exists
    assert open(path).read() == before  # kept, not replaced by TFX's default
    steps = _dockerfile(path)
    assert "FROM" in dict(steps) and any("-r ${STACK}.lock" in args for kind, args in steps if kind == "RUN")
    assert not os.path.exists(os.path.join(PROJECT_DIR, "kubeflow", "Dockerfile"))  # one Dockerfile, at the root


def test_compile_replaces_its_own_job_and_never_a_file_it_did_not_write(tmp_path):
    """`imagepipe compile --output`: a second compile replaces the first job; a file imagepipe did not write is
    one line, untouched (storage/user_files.py)."""
    config, cloud = production()
    path = str(tmp_path / "job.json")
    deploy.compile_pipeline(config, cloud, path)
    deploy.compile_pipeline(config, cloud, path)  # its own: replaced
    assert json.load(open(path))["pipelineSpec"]["pipelineInfo"]["name"] == "imagepipe"
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    with pytest.raises(ConfigError, match="^--output .*notes.json") as refused:
        deploy.compile_pipeline(config, cloud, str(notes))
    assert "\n" not in str(refused.value) and notes.read_text() == '{"mine": 1}'
    kubeflow_config, kubeflow_cloud = production(target="kubeflow", kfp_host="http://kfp")
    package = str(tmp_path / "pipeline.yaml")
    deploy.compile_pipeline(kubeflow_config, kubeflow_cloud, package)
    deploy.compile_pipeline(kubeflow_config, kubeflow_cloud, package)  # its own YAML too
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]
