"""Compiles the pipeline for Vertex AI Pipelines or Kubeflow Pipelines v2, and submits or schedules it.

The DAG is pipeline.pipeline.create_pipeline(config, cloud_platform.platform(config, cloud)): the same one
LocalDagRunner runs. KubeflowV2DagRunner compiles it to a PipelineJob (JSON),
which Vertex AI takes as it is. A self-hosted Kubeflow Pipelines' kfp.Client
(2.5) takes only a bare PipelineSpec in a .yaml (or .zip/.tar.gz) package, so
for `--target kubeflow` the PipelineSpec is extracted and the pipeline root
stored in it.

Every call to a service goes through the service's own client library
(google-cloud-aiplatform, kfp); `dry_run=True` returns what would be sent.
"""

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, Optional

import yaml
from google.protobuf import json_format

from pipeline.cloud_config import CloudConfig
from pipeline.config import ConfigError, PipelineConfig
from pipeline.runtime_parameters import RUNTIME_PARAMETERS, job_parameters
from storage import user_files


@contextlib.contextmanager
def image_example_gen_driver():
    """Compiles ImageExampleGen with its own pre-cache driver (components/example_gen/vertex_driver.py).

    TFX's step builder names the file-based ExampleGen driver in a module constant, with no
    option to change it; it is swapped for the duration of a compile only.
    """
    # TFX (~12 s): only compiling needs it (a dry-run submit or schedule does not)
    from tfx.orchestration.kubeflow.v2 import step_builder

    from components.example_gen.vertex_driver import DRIVER_COMMAND  # imports TFX too: as above

    original = step_builder._DRIVER_COMMANDS  # pylint: disable=protected-access
    step_builder._DRIVER_COMMANDS = DRIVER_COMMAND  # pylint: disable=protected-access
    try:
        yield
    finally:
        step_builder._DRIVER_COMMANDS = original  # pylint: disable=protected-access


def run_runner(runner, tfx_pipeline, **kwargs):
    """KubeflowV2DagRunner.run(), with this project's ExampleGen driver."""
    with image_example_gen_driver():
        return runner.run(tfx_pipeline, **kwargs)


def parameter_defaults(config: PipelineConfig) -> Dict[str, Any]:
    """The job's runtime parameters (pipeline/runtime_parameters.py RUNTIME_PARAMETERS) with this configuration's values: the
    compiled spec declares only their types, the job's runtimeConfig carries these values."""
    return {name: RUNTIME_PARAMETERS[name](getattr(config, name)) for name in job_parameters(config)}


def make_runner(cloud: CloudConfig, output_filename: Optional[str] = None):
    """The KubeflowV2DagRunner for `cloud`: `imagepipe compile` and the TFX CLI's runner file both use it."""
    # TFX (~12 s): only compiling needs it (a dry-run submit or schedule does not)
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner as runner_lib

    class Runner(runner_lib.KubeflowV2DagRunner):
        """TFX's runner, with the first task never taken from Vertex's cache (never_cached)."""

        def run(self, pipeline, parameter_values=None, write_out=True):
            # The TFX CLI patches the base class's run to choose the output folder: it is called, then the file
            # written here, where TFX would write it.
            job = never_cached(super().run(pipeline, parameter_values=parameter_values, write_out=False))
            job = with_example_gen_machine(job, pipeline)
            if write_out:  # where the TFX CLI keeps the pipeline (or the runner's own folder): whole, then renamed
                path = os.path.join(self._output_dir, self._output_filename)
                partial = user_files.partial_path(path)
                with open(partial, "w") as f:
                    json.dump(job, f, indent=2, sort_keys=True)
                os.replace(partial, path)
            return job

    return Runner(
        config=runner_lib.KubeflowV2DagRunnerConfig(default_image=cloud.image), output_filename=output_filename
    )


def with_example_gen_machine(job: Dict[str, Any], pipeline) -> Dict[str, Any]:
    """`job` with ImageExampleGen's machine (its platform_config, as every step's: pipeline.py size_steps) in its
    executor's container: TFX's compiler builds an ExampleGen's container apart, and leaves it out."""
    example_gen = next((c for c in pipeline.components if c.id == "ImageExampleGen"), None)
    if example_gen is None or not example_gen.platform_config:
        return job
    spec = job["pipelineSpec"]
    task = spec["root"]["dag"]["tasks"]["ImageExampleGen"]
    label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
    container = spec["deploymentSpec"]["executors"][label]["container"]
    container["resources"] = json_format.MessageToDict(example_gen.platform_config)
    return job


def never_cached(job: Dict[str, Any]) -> Dict[str, Any]:
    """`job` with its RunCheck task never taken from Vertex's cache: a cached check would skip the account
    check of a run started another way (pipeline/run_check.py)."""
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    if "RunCheck" in tasks:
        tasks["RunCheck"]["cachingOptions"] = {"enableCache": False}
    return job


def build_job(config: PipelineConfig, cloud: CloudConfig, output_filename: Optional[str] = None) -> Dict[str, Any]:
    """The compiled PipelineJob, as a dict (Vertex's format); also written to output_filename if given."""
    # TFX and PIL (~12 s): only compiling needs them (a dry-run submit or schedule does not)
    from kubeflow import cloud_platform
    from pipeline import model_choice
    from pipeline.pipeline import create_pipeline

    config = model_choice.resolved(config, model_choice.for_compiled_job())  # --model auto
    return run_runner(
        make_runner(cloud, output_filename),
        create_pipeline(config, cloud_platform.platform(config, cloud)),
        parameter_values=parameter_defaults(config),
        write_out=output_filename is not None,
    )


def kubeflow_package(job: Dict[str, Any], pipeline_root: str, always_ingest: bool) -> Dict[str, Any]:
    """The bare PipelineSpec that kfp.Client accepts, with its default pipeline root.

    Kubeflow Pipelines' open-source backend does not run Vertex's pre-cache driver hook, so
    ImageExampleGen resolves {SPAN} itself there (ingest_settings.py) and, with spans, is never taken
    from the cache: a cached ingestion could never see a new span.
    """
    spec = json.loads(json.dumps(job["pipelineSpec"]))
    spec["defaultPipelineRoot"] = pipeline_root
    # kfp.Client takes the runtime parameters' values from the spec's defaults (Vertex, from runtimeConfig).
    for name, value in job["runtimeConfig"].get("parameters", {}).items():
        kind, raw = next(iter(value.items()))  # {"intValue": "100"}, {"doubleValue": 0.9}, {"stringValue": ...}
        spec["root"]["inputDefinitions"]["parameters"][name]["defaultValue"] = (
            int(raw) if kind == "intValue" else float(raw) if kind == "doubleValue" else raw
        )
    for executor in spec["deploymentSpec"]["executors"].values():
        executor.get("container", {}).pop("lifecycle", None)
    if always_ingest:
        spec["root"]["dag"]["tasks"]["ImageExampleGen"]["cachingOptions"] = {"enableCache": False}
    return spec


def compile_pipeline(config: PipelineConfig, cloud: CloudConfig, output: str) -> str:
    """Writes the compiled pipeline to `output` (.json for Vertex, .yaml for Kubeflow); returns it."""
    job = build_job(config, cloud)
    if cloud.target == "vertex":
        text = json.dumps(job, indent=2, sort_keys=True)
    else:
        package = kubeflow_package(
            job, cloud.full_pipeline_root(config.pipeline_name), always_ingest=bool(config.span_pattern)
        )
        text = yaml.safe_dump(package, sort_keys=True)
    # Whole, under a fresh temporary name, and never over a file imagepipe did not write (storage/user_files.py).
    return user_files.write_whole(output, text.encode(), "--output", COMPILED_JOB)


# A job compile_pipeline wrote: Vertex's PipelineJob JSON (sorted keys: its pipelineSpec comes early), or
# Kubeflow's PipelineSpec YAML (sorted keys: it starts with its components).
COMPILED_JOB = user_files.Kind(
    "a compiled pipeline", lambda head: b'"pipelineSpec"' in head or head.startswith(b"components:")
)


def default_output(config: PipelineConfig, cloud: CloudConfig) -> str:
    return f"{config.pipeline_name}_pipeline.{'json' if cloud.target == 'vertex' else 'yaml'}"


@contextlib.contextmanager
def _compiled(config: PipelineConfig, cloud: CloudConfig) -> Iterator[str]:
    """The pipeline compiled into a temporary file for a client to send, removed when the block ends."""
    folder = tempfile.mkdtemp(prefix="imagepipe-")
    try:
        yield compile_pipeline(config, cloud, os.path.join(folder, default_output(config, cloud)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


NO_CREDENTIALS = (
    "no Google Cloud credentials found: run 'gcloud auth application-default login' (or set "
    "GOOGLE_APPLICATION_CREDENTIALS to a service account key file), then try again"
)


def check_credentials(credentials=None) -> None:
    """ConfigError at once when no Application Default Credentials can be found: the Vertex client would look for
    them in every call, ask the GCE metadata server for a while, and end in a traceback of 26 lines."""
    if credentials is not None:
        return
    # google-auth: only a job sent to Vertex AI (not a compile, not a dry run) looks for credentials
    import google.auth
    from google.auth import environment_vars, exceptions

    try:
        from google.auth import _cloud_sdk  # a private module, which a google-auth may lack (hence the try)

        user_file = _cloud_sdk.get_application_default_credentials_path()
    except Exception:  # noqa: BLE001 - a google-auth without it: ask google.auth below
        user_file = ""
    given = os.environ.get(environment_vars.CREDENTIALS)
    from pipeline import run_check  # its TFX component import only when a credential is looked for

    on_google_cloud = run_check.on_google_cloud()
    if not given and not (user_file and os.path.exists(user_file)) and not on_google_cloud:
        raise ConfigError(NO_CREDENTIALS)
    try:
        google.auth.default()
    except exceptions.DefaultCredentialsError as e:
        raise ConfigError(f"{NO_CREDENTIALS} ({str(e).splitlines()[0][:160]})") from None


def _vertex_init(cloud: CloudConfig, credentials=None):
    from google.cloud import aiplatform  # google-cloud-aiplatform (~2 s): only a job sent to Vertex AI needs it

    check_credentials(credentials)
    kwargs = {}
    if cloud.api_endpoint:
        kwargs["api_endpoint"] = cloud.api_endpoint
        if cloud.api_endpoint.startswith("http"):
            kwargs["api_transport"] = "rest"  # an explicit http(s):// endpoint speaks REST
    aiplatform.init(project=cloud.project, location=cloud.region, credentials=credentials, **kwargs)
    return aiplatform


def _vertex_job(aiplatform, config: PipelineConfig, cloud: CloudConfig, template: str, parameters: Dict[str, Any]):
    return aiplatform.PipelineJob(
        display_name=config.pipeline_name,
        template_path=template,
        parameter_values=parameters or None,  # the compiled job's runtime parameters (RUNTIME_PARAMETERS)
        pipeline_root=cloud.full_pipeline_root(config.pipeline_name),
        # With caching (the default), a scheduled run without a new span reuses every component
        # instead of silently retraining on the data it already learned from.
        enable_caching=config.enable_cache,
        project=cloud.project,
        location=cloud.region,
        labels={"pipeline": config.pipeline_name},
    )


def submit(
    config: PipelineConfig,
    cloud: CloudConfig,
    dry_run: bool = False,
    credentials=None,
    parameters: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Starts one run now (with `parameters`: values of the job's runtime parameters, checked by
    pipeline.runtime_parameters.runtime_values); returns the request (and, when sent, the created run's name)."""
    parameters = parameters or {}
    request = _describe(config, cloud, parameters)
    if dry_run:
        return request
    if cloud.target == "vertex":
        aiplatform = _vertex_init(cloud, credentials)
        with _compiled(config, cloud) as template:
            job = _vertex_job(aiplatform, config, cloud, template, parameters)
        job.submit(service_account=cloud.service_account)
        return {**request, "run": job.resource_name}
    client = _kfp_client(cloud)
    with _compiled(config, cloud) as template:
        run = client.create_run_from_pipeline_package(
            template,
            arguments=parameters,
            run_name=f"{config.pipeline_name}-run",
            experiment_name=config.pipeline_name,
            pipeline_root=cloud.full_pipeline_root(config.pipeline_name),
            enable_caching=config.enable_cache,
            service_account=cloud.k8s_service_account,
        )
    return {**request, "run": run.run_id}


def schedule(
    config: PipelineConfig,
    cloud: CloudConfig,
    dry_run: bool = False,
    credentials=None,
    parameters: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Creates the recurring run for cloud.cron (each run with `parameters`, as submit()); returns the request
    (and the schedule's name)."""
    parameters = parameters or {}
    request = {
        **_describe(config, cloud, parameters),
        "cron": cloud.cron,
        "max_concurrent_runs": 1,
        "schedule": cloud.schedule_name or f"{config.pipeline_name}-retraining",
    }
    if cloud.target == "kubeflow":
        request["kubeflow_cron"] = kubeflow_cron(cloud.cron)
    if dry_run:
        return request
    if cloud.target == "vertex":
        return _schedule_on_vertex(config, cloud, credentials, parameters, request)
    return _schedule_on_kubeflow(config, cloud, parameters, request)


def _schedule_on_vertex(
    config: PipelineConfig, cloud: CloudConfig, credentials, parameters: Dict[str, Any], request: Dict[str, Any]
) -> Dict[str, Any]:
    """A Vertex AI PipelineJobSchedule, unless one of that display name exists."""
    aiplatform = _vertex_init(cloud, credentials)
    existing = aiplatform.PipelineJobSchedule.list(filter=f'display_name="{request["schedule"]}"')
    if existing:
        raise ScheduleExists(request["schedule"], existing[0].resource_name)
    with _compiled(config, cloud) as template:
        job = _vertex_job(aiplatform, config, cloud, template, parameters)
    created = job.create_schedule(
        display_name=request["schedule"],
        cron=cloud.cron,
        max_concurrent_run_count=1,
        service_account=cloud.service_account,
    )
    return {**request, "schedule_resource": created.resource_name}


def _schedule_on_kubeflow(
    config: PipelineConfig, cloud: CloudConfig, parameters: Dict[str, Any], request: Dict[str, Any]
) -> Dict[str, Any]:
    """A Kubeflow Pipelines recurring run in the pipeline's experiment, unless one of that name is there."""
    client = _kfp_client(cloud)
    experiment = client.create_experiment(name=config.pipeline_name)
    page_token = ""
    while True:
        listed = client.list_recurring_runs(
            experiment_id=experiment.experiment_id, page_size=100, page_token=page_token
        )
        for recurring in listed.recurring_runs or []:
            if recurring.display_name == request["schedule"]:
                raise ScheduleExists(request["schedule"], recurring.recurring_run_id)
        page_token = listed.next_page_token
        if not page_token:
            break
    with _compiled(config, cloud) as template:
        recurring = client.create_recurring_run(
            experiment_id=experiment.experiment_id,
            job_name=request["schedule"],
            cron_expression=request["kubeflow_cron"],
            max_concurrency=1,
            no_catchup=True,
            pipeline_package_path=template,
            pipeline_root=cloud.full_pipeline_root(config.pipeline_name),
            params=parameters,
            enable_caching=config.enable_cache,
            service_account=cloud.k8s_service_account,
        )
    return {**request, "schedule_resource": recurring.recurring_run_id}


class ScheduleExists(RuntimeError):
    """A schedule of that name exists: a second one would run the pipeline twice as often."""

    def __init__(self, name: str, resource: str):
        super().__init__(
            f"a schedule named {name!r} already exists ({resource}); delete it first, or give another --schedule-name"
        )


def kubeflow_cron(cron: str) -> str:
    """Kubeflow Pipelines' cron has a seconds field first: '0 3 * * 1' -> '0 0 3 * * 1'."""
    return f"0 {cron}"


def _kfp_client(cloud: CloudConfig):
    import kfp  # kfp's client: only a job sent to Kubeflow Pipelines needs it

    return kfp.Client(host=cloud.kfp_host)


def _describe(config: PipelineConfig, cloud: CloudConfig, parameters: Dict[str, Any]) -> Dict[str, Any]:
    where = f"projects/{cloud.project}/locations/{cloud.region}" if cloud.target == "vertex" else cloud.kfp_host
    account = cloud.service_account if cloud.target == "vertex" else cloud.k8s_service_account
    return {
        "target": cloud.target,
        "where": where,
        "pipeline": config.pipeline_name,
        "pipeline_root": cloud.full_pipeline_root(config.pipeline_name),
        "image": cloud.image,
        "data": config.data,
        "span_pattern": config.span_pattern,
        "service_account": account,
        "enable_caching": config.enable_cache,
        "dataflow": cloud.dataflow,
        "vertex_training": cloud.vertex_training,
        "tune": config.tune_trials or None,
        "parameters": ", ".join(f"{k}={v}" for k, v in parameters.items()) or None,
    }


def describe_lines(request: Dict[str, Any]) -> list:
    return [f"  {key}: {value}" for key, value in request.items() if value not in (None, False, "")]
