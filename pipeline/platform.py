"""Where the DAG runs: the choices that differ between runners.

Each runner makes a Platform and passes it to create_pipeline(), as the TFX templates pass
pipeline_root, beam_pipeline_args and the cloud Trainer's and Pusher's arguments; the DAG itself
never asks which runner it is on.

    local(config)                            pipeline/local_runner.py: folders under --root, resolvers
    kubeflow/cloud_platform.platform(...)    Vertex AI / Kubeflow: gs:// root, Dataflow, Vertex AI
                                             Training and endpoints, the schema's path in the image
"""

import dataclasses
from typing import Any, Dict, List, Optional

from pipeline.config import PipelineConfig


@dataclasses.dataclass(frozen=True)
class Platform:
    pipeline_root: str
    beam_pipeline_args: List[str]
    serving_dir: str  # the Pusher's folder for blessed models (unless vertex_serving_config deploys them)
    feature_cache: str  # the backbone features cache, shared by the pipelines of one root
    schema_file: Optional[str] = None  # the curated schema, as this platform's containers see it
    runs_resolvers: bool = True  # the orchestrator runs TFX resolver nodes (Kubeflow's open-source backend does not)
    vertex_training_config: Optional[Dict[str, Any]] = None  # set: the Trainer is a Vertex AI Training job
    vertex_serving_config: Optional[Dict[str, Any]] = None  # set: the Pusher deploys to a Vertex AI endpoint
    vertex_tuning_config: Optional[Dict[str, Any]] = None  # set: the Tuner's trials run as a Vertex AI Training job
    parallel_trials: int = 1  # trials at once in that job (a machine each)
    # Compiled for an orchestrator (Vertex AI, Kubeflow) rather than run here: the settings a run can change
    # (epochs, learning rate, ...) are pipeline parameters (RuntimeParameters), and resolvers use the strategies
    # its compiler knows. A local run takes the settings from the configuration.
    compiled: bool = False
    # Vertex AI: the service account runs execute as (--service-account); the compiled job's first task
    # (pipeline/run_check.py) refuses to run as another.
    service_account: str = ""
    # A compiled job's machine for each step (by component id: StepMachine), and Beam options of its own for a step
    # that runs Beam (on Dataflow: its workers' machine type); a local run has neither.
    step_machines: Dict[str, "StepMachine"] = dataclasses.field(default_factory=dict)
    step_beam_args: Dict[str, List[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepMachine:
    """What a step's container asks of Vertex AI Pipelines: CPUs, memory (GB), and an accelerator."""

    cpus: float
    memory_gb: float
    accelerator: str = ""  # e.g. NVIDIA_TESLA_T4
    accelerator_count: int = 0


def local(config: PipelineConfig) -> Platform:
    """This machine: LocalDagRunner, SQLite ML Metadata, Beam's local runner, folders under --root."""
    return Platform(
        pipeline_root=config.pipeline_root,
        beam_pipeline_args=list(config.beam_args),
        serving_dir=config.serving_dir,
        feature_cache=config.feature_cache,
        schema_file=config.schema_path(),
    )
