"""The Platform (pipeline/platform.py) of a run on Vertex AI Pipelines or Kubeflow Pipelines.

Everything there runs in the pipeline image (./Dockerfile) and reads and writes gs://: the
pipeline root is <pipeline-root>/<name>, blessed models go to its serving/ folder (or a Vertex AI
endpoint), the data components run on Dataflow with --dataflow, the Trainer on Vertex AI Training
with --vertex-training, and a curated schema is read at its path inside the image.
"""

import os
import posixpath
from typing import List

from tfx import v1 as tfx

from pipeline.cloud_config import IMAGE_PROJECT_DIR, CloudConfig
from pipeline.config import PROJECT_DIR, ConfigError, PipelineConfig
from pipeline.platform import Platform, StepMachine
from storage.files import is_remote


def platform(config: PipelineConfig, cloud: CloudConfig) -> Platform:
    root = cloud.full_pipeline_root(config.pipeline_name)
    schema = config.schema_path()
    return Platform(
        pipeline_root=root,
        beam_pipeline_args=dataflow_args(config, cloud) if cloud.dataflow else list(config.beam_args),
        serving_dir=f"{root}/serving",
        feature_cache=cloud.feature_cache,
        schema_file=schema_in_image(schema) if schema else None,
        runs_resolvers=cloud.runs_resolvers,
        vertex_training_config=vertex_training_config(cloud) if cloud.vertex_training else None,
        vertex_serving_config=vertex_serving_config(cloud) if cloud.endpoint else None,
        # With --vertex-training, the Tuner's trials run there too, --parallel-trials machines at once.
        vertex_tuning_config=vertex_tuning_config(config, cloud) if cloud.vertex_training else None,
        parallel_trials=cloud.parallel_trials,
        compiled=True,
        service_account=(cloud.service_account or "") if cloud.target == "vertex" else "",
        step_machines=dict(STEP_MACHINES),
        step_beam_args={step: list(args) for step, args in DATAFLOW_STEP_ARGS.items()} if cloud.dataflow else {},
    )


# Each step's container on Vertex AI Pipelines, sized for a million images (docs/scale.md has the per-image costs
# they come from): the steps that run Beam launch Dataflow with --dataflow and need little themselves, but run
# in their container without it; DataHealth's container runs the label check on a bounded sample; the
# Evaluator runs TFMA and the explanations; the Trainer's machine is Vertex AI Training's with --vertex-training.
STEP_MACHINES = {
    "ImageExampleGen": StepMachine(8, 32),
    "StatisticsGen": StepMachine(8, 32),
    "Transform": StepMachine(8, 32),
    "BackboneFeatures": StepMachine(8, 32),
    "DataHealth": StepMachine(4, 16),
    "Tuner": StepMachine(8, 32),
    "Trainer": StepMachine(8, 32),
    "Evaluator": StepMachine(8, 32),
}
# On Dataflow, the steps whose per-image work is heavy get workers of their own size: the backbone runs once per
# image in BackboneFeatures (compute-bound: more cores a worker), and the Evaluator runs the whole model.
DATAFLOW_STEP_ARGS = {
    "BackboneFeatures": ["--machine_type=n1-standard-8"],
    "Evaluator": ["--machine_type=n1-standard-8"],
}


def schema_in_image(schema_file: str) -> str:
    """A schema from this repository, as the pipeline image sees it (./Dockerfile copies the tree)."""
    if is_remote(schema_file):
        return schema_file
    relative = os.path.relpath(os.path.abspath(schema_file), PROJECT_DIR)
    if relative.startswith(".."):
        raise ConfigError(
            f"--schema {schema_file}: outside this repository, so not in the pipeline image; "
            "copy it into schemas/ (and rebuild the image) or upload it to gs://"
        )
    return posixpath.join(IMAGE_PROJECT_DIR, *relative.split(os.sep))


def dataflow_args(config: PipelineConfig, cloud: CloudConfig) -> List[str]:
    """Beam arguments that run the data components on Dataflow, with the pipeline image as workers."""
    temp = cloud.dataflow_temp(config.pipeline_name)
    args = [
        "--runner=DataflowRunner",
        f"--project={cloud.project}",
        f"--region={cloud.region}",
        f"--temp_location={temp}",
        f"--max_num_workers={cloud.dataflow_max_workers}",
        f"--machine_type={cloud.dataflow_machine_type}",
        # Workers run this image, so components.* and trainer.* import there as they do here.
        f"--sdk_container_image={cloud.image}",
        "--experiments=use_runner_v2",
    ]
    if cloud.service_account:
        args.append(f"--service_account_email={cloud.service_account}")
    return args + list(config.beam_args)


def vertex_training_config(cloud: CloudConfig) -> dict:
    """custom_config entries that make the Trainer a Vertex AI Training custom job: one machine, or with
    --training-replicas N a chief pool and a pool of N - 1 workers alike (Vertex sets TF_CONFIG on each, and
    trainer/strategy.py trains across them). With --training-tpu, the Trainer must find the TPU (HParams
    required_device): it fails rather than train on the TPU VM's CPU."""
    ext = tfx.extensions.google_cloud_ai_platform
    if cloud.training_tpu:
        machine = {"machine_type": "cloud-tpu", "accelerator_type": cloud.training_tpu, "accelerator_count": 8}
    else:
        machine = {"machine_type": cloud.training_machine_type}
        if cloud.training_accelerator:
            machine.update(
                accelerator_type=cloud.training_accelerator, accelerator_count=cloud.training_accelerator_count
            )
    image = cloud.training_image or cloud.image
    pools = [{"machine_spec": machine, "replica_count": 1, "container_spec": {"image_uri": image}}]
    if cloud.training_replicas > 1:
        pools.append(
            {
                "machine_spec": dict(machine),
                "replica_count": cloud.training_replicas - 1,
                "container_spec": {"image_uri": image},
            }
        )
    job_spec = {"worker_pool_specs": pools}
    if cloud.service_account:
        job_spec["service_account"] = cloud.service_account
    return {
        ext.ENABLE_VERTEX_KEY: True,
        ext.VERTEX_REGION_KEY: cloud.region,
        ext.TRAINING_ARGS_KEY: {"project": cloud.project, "job_spec": job_spec},
        **({REQUIRED_DEVICE_KEY: "tpu"} if cloud.training_tpu else {}),
    }


REQUIRED_DEVICE_KEY = "required_device"  # HParams.required_device, in the Trainer's and the Tuner's custom_config


def vertex_tuning_config(config: PipelineConfig, cloud: CloudConfig) -> dict:
    """custom_config entries that make the Tuner's search a Vertex AI Training job (TFX's Vertex Tuner
    extension): the primary replica's machine as the Trainer's; the extension adds parallel_trials - 1
    workers like it, which run trials against a chief oracle on the primary."""
    ext = tfx.extensions.google_cloud_ai_platform
    trainer = vertex_training_config(cloud)
    training = trainer[ext.TRAINING_ARGS_KEY]
    # A trial trains on one machine like the Trainer's chief: the extension's workers are parallel trials.
    training["job_spec"]["worker_pool_specs"] = training["job_spec"]["worker_pool_specs"][:1]
    return {
        ext.ENABLE_VERTEX_KEY: True,
        ext.VERTEX_REGION_KEY: cloud.region,
        **({REQUIRED_DEVICE_KEY: trainer[REQUIRED_DEVICE_KEY]} if REQUIRED_DEVICE_KEY in trainer else {}),
        ext.experimental.TUNING_ARGS_KEY: training,
        ext.experimental.REMOTE_TRIALS_WORKING_DIR_KEY: f"{cloud.full_pipeline_root(config.pipeline_name)}/tuner",
    }


def vertex_serving_config(cloud: CloudConfig) -> dict:
    """custom_config for the Vertex Pusher: deploy blessed models to an endpoint."""
    ext = tfx.extensions.google_cloud_ai_platform
    return {
        ext.ENABLE_VERTEX_KEY: True,
        ext.VERTEX_REGION_KEY: cloud.region,
        ext.VERTEX_CONTAINER_IMAGE_URI_KEY: cloud.serving_image,
        ext.SERVING_ARGS_KEY: {
            "project_id": cloud.project,
            "endpoint_name": cloud.endpoint,
            "machine_type": "n1-standard-4",
        },
    }
