"""The production settings: where and how the same DAG runs on Vertex AI Pipelines or a self-hosted Kubeflow
Pipelines v2 (`imagepipe compile | submit | schedule`, kubeflow/). Like PipelineConfig (config.py), the CLI
and the environment (`IMAGEPIPE_<FIELD>`) override the defaults.
"""

import dataclasses
import re
from typing import Optional

from pipeline.config import ConfigError, PipelineConfig
from settings import checked, declared, setting
from storage.errors import shown
from storage.files import is_remote

TARGETS = ("vertex", "kubeflow")
MAX_TRAINING_REPLICAS = 64
# What Vertex AI Training accepts (aiplatform_v1.AcceleratorType; tests/test_production.py keeps these in step with
# it): GPUs by type and count a machine; TPUs as a cloud-tpu machine of 8 cores (kubeflow/cloud_platform.py).
GPU_TYPES = (
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_L4",
    "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB",
    "NVIDIA_B200",
)
GPU_COUNTS = (1, 2, 4, 8, 16)
TPU_TYPES = ("TPU_V2", "TPU_V3")
# Which commands take which settings as options: compile, submit and schedule take them all but SCHEDULE_ONLY;
# `imagepipe predict --dataflow` takes FOR_DATAFLOW_PREDICTION.
SCHEDULE_ONLY = ("cron", "schedule_name")
FOR_DATAFLOW_PREDICTION = ("project", "region", "pipeline_root", "image", "service_account") + (
    "dataflow",
    "dataflow_max_workers",
    "dataflow_machine_type",
    "dataflow_temp_location",
)
# Inside the pipeline image (./Dockerfile), the project is copied here.
IMAGE_PROJECT_DIR = "/pipeline"


@dataclasses.dataclass
class CloudConfig:
    """Where and how the same DAG runs in production, each setting declared once (settings.setting()): its option of
    `imagepipe compile | submit | schedule` (cli/parser.py makes them), its IMAGEPIPE_<FIELD> variable, its check.
    What settings need of each other is validate()'s."""

    target: str = setting("vertex", "Vertex AI Pipelines (default) or Kubeflow Pipelines v2", TARGETS)
    project: Optional[str] = setting(None, "GCP project")  # Vertex, Dataflow, Vertex AI Training
    region: str = setting("us-central1", "GCP region (default {default})")
    pipeline_root: Optional[str] = setting(None, "gs://BUCKET/PATH for the runs' artifacts")
    image: Optional[str] = setting(None, "the pipeline image (built from ./Dockerfile)")
    service_account: Optional[str] = setting(
        None, "the GCP service account (email) Vertex runs and Dataflow workers execute as"
    )
    k8s_service_account: Optional[str] = setting(None, "Kubeflow: the Kubernetes service account of the run pods")
    api_endpoint: Optional[str] = setting(None, "Vertex AI API endpoint (private endpoints)")
    # e.g. http://ml-pipeline-ui.kubeflow:80
    kfp_host: Optional[str] = setting(None, "Kubeflow Pipelines API URL (for --target kubeflow)")
    # Data components (ExampleGen, StatisticsGen, Transform, Evaluator) on Dataflow.
    dataflow: bool = setting(
        False,
        "run on Dataflow workers that run the pipeline image: the pipeline's ExampleGen, StatisticsGen, Transform "
        "and Evaluator; predict's classification (gs:// --model, --output and inputs)",
    )
    dataflow_max_workers: int = setting(8, "(default {default})")
    dataflow_machine_type: str = setting("n1-standard-4", "(default {default})")
    dataflow_temp_location: Optional[str] = setting(None, "gs:// (default <pipeline-root>/<name>/tmp)")
    # The Trainer as a Vertex AI Training job on accelerators.
    vertex_training: bool = setting(False, "run the Trainer as a Vertex AI Training job")
    training_machine_type: str = setting("n1-standard-8", "(default {default})")
    training_accelerator: Optional[str] = setting(None, "e.g. NVIDIA_TESLA_T4, NVIDIA_L4")
    training_accelerator_count: int = setting(1, "(default {default})")
    training_tpu: Optional[str] = setting(
        None, "a TPU type for the Trainer instead, e.g. TPU_V3 (8 cores); needs --training-image"
    )
    # Machines of that type (and accelerators) the Trainer trains on at once (trainer/strategy.py).
    training_replicas: int = setting(
        1,
        "train on N machines of that type at once: a chief and N - 1 workers (MultiWorkerMirroredStrategy; "
        "default {default})",
        metavar="N",
    )
    # With --training-tpu, the TPU build: ./Dockerfile built with --build-arg ACCELERATOR=tpu (TensorFlow's TPU
    # build and its libtpu).
    training_image: Optional[str] = setting(
        None,
        "the image Vertex AI Training runs (default --image); for --training-tpu its TPU build: ./Dockerfile with "
        "--build-arg ACCELERATOR=tpu",
    )
    parallel_trials: int = setting(
        1,
        "with --tune and --vertex-training: trials at once, a training machine each (TFX's Vertex Tuner; default "
        "{default})",
    )
    # Push blessed models to a Vertex AI endpoint (by display name) instead of a folder.
    endpoint: Optional[str] = setting(None, "deploy blessed models to this Vertex AI endpoint (display name)")
    serving_image: str = setting(
        "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-16:latest",
        "the prediction image of the Vertex AI endpoint's model (default {default})",
        flag=None,
    )
    # Scheduled retraining (`imagepipe schedule`).
    cron: Optional[str] = setting(None, "standard 5-field cron, UTC, e.g. '0 3 * * 1' (Mondays 03:00)")
    schedule_name: Optional[str] = setting(None, "(default <name>-retraining)")

    @property
    def runs_resolvers(self) -> bool:
        """Whether the target runs TFX resolver nodes (the latest blessed model, for the Evaluator's
        baseline, warm start and drift): Vertex does; Kubeflow Pipelines' open-source backend does not."""
        return self.target == "vertex"

    def full_pipeline_root(self, pipeline_name: str) -> str:
        return f"{self.pipeline_root.rstrip('/')}/{pipeline_name}"

    @property
    def feature_cache(self) -> str:
        """The backbone features cache under --pipeline-root, shared by the pipelines there."""
        return f"{self.pipeline_root.rstrip('/')}/cache/features"

    def dataflow_temp(self, pipeline_name: str) -> Optional[str]:
        """Where Dataflow jobs stage files: --dataflow-temp-location, else the pipeline root's tmp/."""
        if self.dataflow_temp_location or not self.pipeline_root:
            return self.dataflow_temp_location
        return f"{self.full_pipeline_root(pipeline_name)}/tmp"

    def check_names(self) -> None:
        """The GCP names given, in the forms GCP accepts (one line each): they go into job specs, requests
        and Dataflow's command lines, so a project `p"; rm -rf /` or a region `../../x` stops here."""
        for option, value, pattern, form in _NAME_RULES:
            value = getattr(self, value)
            if value is not None and not re.fullmatch(pattern, value):
                raise ConfigError(f"--{option} {value!r}: not a valid {form}")
        for option, path in (
            ("pipeline-root", self.pipeline_root),
            ("dataflow-temp-location", self.dataflow_temp_location),
        ):
            if path and path.startswith("gs://") and not re.fullmatch(_GCS_PATH, path):
                raise ConfigError(
                    f"--{option} {path!r}: not a Cloud Storage path; give gs://BUCKET/PATH (a bucket "
                    "name is 3-63 lower-case letters, digits, dots, dashes or underscores)"
                )

    def _check_accelerators(self) -> None:
        """Accelerator types and counts Vertex AI Training accepts, checked when compiling (a bad one failed at
        Vertex's Trainer step, after ingestion and Transform)."""
        if self.training_accelerator and self.training_accelerator not in GPU_TYPES:
            raise ConfigError(
                f"--training-accelerator {shown(self.training_accelerator)!r}: use one of "
                f"{', '.join(GPU_TYPES)} (or --training-tpu for a TPU)"
            )
        if self.training_accelerator and self.training_accelerator_count not in GPU_COUNTS:
            raise ConfigError(
                f"--training-accelerator-count {self.training_accelerator_count}: Vertex AI attaches "
                f"{', '.join(map(str, GPU_COUNTS))} GPUs to a machine"
            )
        if self.training_tpu and self.training_tpu not in TPU_TYPES:
            raise ConfigError(
                f"--training-tpu {shown(self.training_tpu)!r}: use one of {', '.join(TPU_TYPES)} (a "
                "cloud-tpu machine of 8 cores)"
            )

    def validate(self, config: PipelineConfig, need_host: bool = False) -> "CloudConfig":
        """One-line errors for everything that would make a compiled pipeline fail remotely."""
        checked(self, declared(CloudConfig), ConfigError)  # each declaration's own check (--target's choices)
        self.check_names()
        self._check_pipeline_settings(config)
        self._check_locations(config)
        self._check_dataflow()
        self._check_training()
        self._check_trials_and_push(config, need_host)
        if self.cron is not None:
            check_cron(self.cron)
        return self

    def _check_pipeline_settings(self, config: PipelineConfig) -> None:
        """The pipeline's own settings that a remote run cannot honour: its name, local files, warm start."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", config.pipeline_name):
            raise ConfigError(
                f"--name {config.pipeline_name!r}: Vertex AI and Kubeflow need lower-case letters, "
                "digits and dashes (at most 63), e.g. pets-classifier"
            )
        weights = config.weights
        if config.model != "cnn" and weights not in ("", "imagenet") and not weights.startswith("gs://"):
            raise ConfigError(
                f"--weights {weights}: a local file is not in the pipeline's containers; upload it "
                "and give a gs:// path, or use imagenet"
            )
        if config.review and not config.review.startswith("gs://"):
            raise ConfigError(
                f"--review {config.review}: a local file is not in the pipeline's containers; upload it "
                "and give a gs:// path"
            )
        if config.warm_start and not self.runs_resolvers:
            raise ConfigError(
                "--warm-start needs the latest blessed model, which TFX resolves with a resolver "
                "node that Kubeflow Pipelines' open-source backend cannot run; use --target vertex"
            )

    def _check_locations(self, config: PipelineConfig) -> None:
        """The project, pipeline root, image and data, each reachable from the cluster."""
        if self.target == "vertex" and not self.project:
            raise ConfigError("no GCP project: give --project (or IMAGEPIPE_PROJECT)")
        if not self.pipeline_root:
            raise ConfigError("no pipeline root: give --pipeline-root gs://BUCKET/PATH (or IMAGEPIPE_PIPELINE_ROOT)")
        if self.target == "vertex" and not self.pipeline_root.startswith("gs://"):
            raise ConfigError(f"--pipeline-root {self.pipeline_root}: Vertex AI needs a gs:// location")
        if not is_remote(self.pipeline_root):
            raise ConfigError(
                f"--pipeline-root {self.pipeline_root}: a local folder is not reachable from the "
                "cluster; use gs:// (or s3://) storage"
            )
        if not self.image:
            raise ConfigError("no pipeline image: build ./Dockerfile, push it, and give --image URI")
        if config.data is None or not is_remote(config.data):
            raise ConfigError(
                f"--data {config.data or '(the local digits sample)'}: the pipeline runs remotely; "
                "upload the images and give --data gs://BUCKET/PATH"
            )

    def _check_dataflow(self) -> None:
        if self.dataflow and not self.project:
            raise ConfigError("--dataflow needs --project")
        temp = self.dataflow_temp_location
        if temp and not temp.startswith("gs://"):
            raise ConfigError(f"--dataflow-temp-location {temp}: Dataflow needs a gs:// location")

    def _check_training(self) -> None:
        """Vertex AI Training's machines: accelerators, replicas and the image they run."""
        if self.vertex_training and not self.project:
            raise ConfigError("--vertex-training needs --project")
        if self.training_accelerator and self.training_tpu:
            raise ConfigError("--training-accelerator and --training-tpu: choose one")
        self._check_accelerators()
        if (self.training_accelerator or self.training_tpu) and not self.vertex_training:
            raise ConfigError("--training-accelerator/--training-tpu apply to --vertex-training; add it")
        if not 1 <= self.training_replicas <= MAX_TRAINING_REPLICAS:
            raise ConfigError(
                f"--training-replicas {self.training_replicas}: use 1 to {MAX_TRAINING_REPLICAS} machines"
            )
        if (self.training_replicas > 1 or self.training_image) and not self.vertex_training:
            raise ConfigError("--training-replicas/--training-image apply to --vertex-training; add it")
        if self.training_tpu and self.training_replicas > 1:
            raise ConfigError(
                "--training-tpu with --training-replicas: a TPU trains as one replica of its 8 cores "
                "here; give one or the other"
            )
        if self.training_tpu and not self.training_image:
            raise ConfigError(
                "--training-tpu needs the TPU build of the pipeline image (TensorFlow's TPU build and "
                "libtpu): docker build --build-arg ACCELERATOR=tpu, push it, and "
                "give --training-image URI"
            )

    def _check_trials_and_push(self, config: PipelineConfig, need_host: bool) -> None:
        """Parallel tuning trials, the Vertex endpoint and the Kubeflow host."""
        if not 1 <= self.parallel_trials <= 64:
            raise ConfigError(f"--parallel-trials {self.parallel_trials}: use 1 to 64 machines")
        if self.parallel_trials > 1 and not (self.vertex_training and config.tune_trials):
            raise ConfigError(
                "--parallel-trials runs the --tune search on Vertex AI Training; add --tune N and --vertex-training"
            )
        if self.endpoint and self.target != "vertex":
            raise ConfigError("--endpoint pushes to Vertex AI; use --target vertex")
        if need_host and self.target == "kubeflow" and not self.kfp_host:
            raise ConfigError("no Kubeflow Pipelines host: give --kfp-host URL (or IMAGEPIPE_KFP_HOST)")


# (option, CloudConfig field, the form GCP accepts, what it is), checked by CloudConfig.check_names.
_NAME_RULES = (
    (
        "project",
        "project",
        r"([a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]",
        "GCP project ID (6-30 lower-case letters, digits and dashes, starting with a letter)",
    ),
    ("region", "region", r"[a-z]+-[a-z]+[0-9]+", "GCP region (e.g. us-central1, europe-west4)"),
    (
        "image",
        "image",
        r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?",
        "container image reference (e.g. us-central1-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG)",
    ),
    (
        "service-account",
        "service_account",
        r"[a-z0-9][a-z0-9-]{0,61}[a-z0-9]?@[a-z0-9][a-z0-9.-]*\.[a-z]+",
        "service account email (NAME@PROJECT.iam.gserviceaccount.com)",
    ),
    (
        "k8s-service-account",
        "k8s_service_account",
        r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?",
        "Kubernetes service account name (lower-case letters, digits, '-' and '.')",
    ),
    ("kfp-host", "kfp_host", r"https?://[^\s\"'`;|&<>]+", "Kubeflow Pipelines URL (http:// or https://)"),
    ("endpoint", "endpoint", r"[^\x00-\x1f\"'`;|&<>]{1,128}", "Vertex AI endpoint display name (1-128 characters)"),
    # A Vertex schedule's display name is 1-128 characters; Kubeflow's recurring run name the same, printable.
    (
        "schedule-name",
        "schedule_name",
        r"[^\x00-\x1f\x7f\"'`;|&<>]{1,128}",
        "schedule name (1-128 printable characters, no quotes or shell characters)",
    ),
)
_GCS_PATH = r"gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^\x00-\x1f]*)?"

# Day of week 0-6 (Sunday = 0): Kubeflow's cron library has no 7.
_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 6))


def check_cron(cron: str) -> None:
    """Accepts standard 5-field cron (numbers, *, ranges, lists, steps); raises ConfigError."""
    fields = cron.split()
    if len(fields) != 5:
        raise ConfigError(
            f"--cron {cron!r}: use 5 fields, minute hour day-of-month month day-of-week "
            "(e.g. '0 3 * * 1' for Mondays at 03:00)"
        )
    for text, (name, low, high) in zip(fields, _CRON_FIELDS):
        for part in text.split(","):
            body, _, step = part.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                raise ConfigError(f"--cron {cron!r}: bad step {step!r} in the {name} field")
            if body == "*":
                continue
            bounds = body.split("-")
            if (
                len(bounds) > 2
                or not all(b.isdigit() for b in bounds)
                or not all(low <= int(b) <= high for b in bounds)
                or int(bounds[0]) > int(bounds[-1])
            ):
                raise ConfigError(f"--cron {cron!r}: {part!r} is not valid for the {name} field ({low}-{high})")
