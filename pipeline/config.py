"""Every setting of the pipeline, and its checks. Each setting is declared once, with settings.setting(), where its
code reads it (settings/__init__.py lists where); PipelineConfig's fields are made from those declarations, and it
declares its own (where a run reads and writes, how it runs) the same way.

`PipelineConfig` holds the defaults; the CLI (`imagepipe run --...`) and the
environment (`IMAGEPIPE_<FIELD>`) override them. `create_pipeline(config, platform)` is
the DAG's only consumer, shared by every runner; each runner makes the platform (pipeline/platform.py).
"""

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import warnings
from typing import List, Optional

from components.drift import Thresholds
from components.evaluator import Blessing
from components.example_gen.ingest_defaults import Ingestion
from components.health import LabelCheck, Limits
from components.tuner import Search
from components.validation import Gate
from images.bounds import decode_memory_bytes
from settings import checked, declared, setting, taken
from storage import review_file
from storage.errors import ConfigError, DataError  # raised here, caught as pipeline.config.ConfigError too
from storage.files import is_remote, local_or_supported
from trainer.hparams import SAMPLE_IMAGE_SIZE, HParams
from trainer.imagenet_weights import check_weights_file

# The repository root: schemas/ and the default run's outputs are found from here.
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_SCHEMA = os.path.join(PROJECT_DIR, "schemas", "digits", "schema.pbtxt")
MAX_CPU_REPLICAS = 16

SAMPLE_PIPELINE_NAME = "digits"


def default_pipeline_name(data: Optional[str]) -> str:
    """A pipeline (a lineage of runs, models and metadata) per dataset: its folder or manifest name
    and a short hash of its full path, e.g. petimages-3f2a9c; lower-case letters, digits and
    dashes, as Vertex AI and Kubeflow need."""
    if not data:
        return SAMPLE_PIPELINE_NAME
    location = data if is_remote(data) else os.path.abspath(os.path.expanduser(data))
    stem = os.path.splitext(location.rstrip("/").rsplit("/", 1)[-1])[0]
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:48].strip("-") or "data"
    return f"{slug}-{hashlib.sha256(location.encode('utf-8', 'surrogateescape')).hexdigest()[:6]}"


# The settings declared where their code reads them, in the order `imagepipe run --help` shows them.
DECLARED = {
    "data": declared(Ingestion),
    "checks": declared(Gate) + declared(Thresholds) + declared(LabelCheck) + declared(Limits),
    "training": declared(HParams),
    "evaluation and search": declared(Blessing) + declared(Search),
}


def _declared(name: str, fields: List[dataclasses.Field]):
    """A dataclass of these declared settings, each with its name, default, help and check, as a base of
    PipelineConfig: a setting is declared once, where its code reads it."""
    return dataclasses.make_dataclass(
        name,
        [
            (
                f.name,
                f.type,
                dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata),
            )
            for f in fields
        ],
    )


DeclaredSettings = _declared("DeclaredSettings", [f for fields in DECLARED.values() for f in fields])
_NAME = (
    lambda v: bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", v)),
    "use letters, digits, '-', '_' or '.' (at most 63), starting with a letter or digit",
)


@dataclasses.dataclass
class PipelineConfig(DeclaredSettings):
    # The pipeline name: its runs, artifacts, metadata and pushed models are kept apart from other
    # pipelines'. None: derived from --data (default_pipeline_name), so each dataset has its own.
    name: Optional[str] = setting(
        None,
        "pipeline name: its runs, models and metadata are kept apart (default: from --data, e.g. "
        "petimages-3f2a9c; 'digits' for the sample)",
        check=_NAME,
    )
    # Where runs write: pipelines/<name> (artifacts), metadata/<name>/metadata.db (ML Metadata),
    # data/ (the sample dataset).
    root: str = setting(
        os.path.join(PROJECT_DIR, ".imagepipe"), "where artifacts and ML Metadata go (default {default})"
    )
    # A folder of class subfolders (optionally train/ and eval/ inside), or a CSV manifest
    # with a path,label[,split] header. None: the bundled digits sample, made on first use.
    data: Optional[str] = setting(
        None,
        "folder of class subfolders (optionally train/ eval/ inside) or a CSV manifest with a path,label[,split] "
        "header; default: the digits sample",
    )
    # A curated schema (schemas/<dataset>/schema.pbtxt) for ImportSchemaGen; None: SchemaGen infers.
    schema: Optional[str] = setting(
        None,
        "curated schema.pbtxt for ImportSchemaGen (default: infer with SchemaGen; the sample uses "
        "schemas/digits/schema.pbtxt)",
    )
    # Split this machine's CPU into this many logical devices and train across them (MirroredStrategy): the
    # multi-replica code runs for real without accelerators (tests, debugging); no faster.
    cpu_replicas: int = setting(
        1,
        "split this machine's CPU into N logical devices and train across them (MirroredStrategy): runs the "
        "multi-replica code without accelerators, for tests and debugging (no faster; default {default})",
        check=(lambda v: 1 <= v <= MAX_CPU_REPLICAS, f"use 1 to {MAX_CPU_REPLICAS} logical CPU devices"),
        metavar="N",
    )
    enable_cache: bool = setting(True, "re-run every component", flag="--no-cache")
    beam_args: List[str] = setting((), "extra Beam pipeline argument (repeatable)", flag="--beam-arg")  # e.g. Dataflow
    # Why the model is the one it is when --model auto chose it (pipeline/model_choice.py sets it; "" otherwise).
    model_choice: str = ""

    def __post_init__(self):
        # Resolved once, here: ML Metadata records artifact paths under the root, and a relative one
        # would mean another folder to every later run, `runs` and `report` started elsewhere.
        if self.root:
            self.root = os.path.abspath(os.path.expanduser(self.root))
        if self.data and self.data.lower().startswith("file://"):  # a file:// URI is a local path
            self.data = local_or_supported(self.data, f"--data {self.data}")

    @property
    def pipeline_name(self) -> str:
        return self.name or default_pipeline_name(self.data)

    @property
    def pipeline_root(self) -> str:
        return os.path.join(self.root, "pipelines", self.pipeline_name)

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.root, "metadata", self.pipeline_name, "metadata.db")

    @property
    def serving_dir(self) -> str:
        return os.path.join(self.root, "serving", self.pipeline_name)

    @property
    def feature_cache(self) -> str:
        """The backbone features cache (components/features): one per root, shared by its pipelines."""
        return os.path.join(self.root, "cache", "features")

    @property
    def sample_data_dir(self) -> str:
        return os.path.join(self.root, "data", "digits")

    @property
    def uses_sample_data(self) -> bool:
        return self.data is None

    def data_path(self) -> str:
        if not self.data:
            return self.sample_data_dir
        return self.data if is_remote(self.data) else os.path.abspath(self.data)

    def schema_path(self) -> Optional[str]:
        if self.schema:
            return self.schema if is_remote(self.schema) else os.path.abspath(self.schema)
        return SAMPLE_SCHEMA if self.uses_sample_data else None

    def hparams(self) -> HParams:
        """The Transform/Trainer hyperparameters for this configuration."""
        given = {f.name: getattr(self, f.name) for f in declared(HParams)}
        if self.image_size is None and self.uses_sample_data:
            given["image_size"] = SAMPLE_IMAGE_SIZE
        # the Trainer chooses its operating point against what the Evaluator will ask (trainer/operating_point.py)
        return HParams(
            **given,
            model_choice=self.model_choice,
            gate_accuracy=self.accuracy_threshold,
            gate_min_class_recall=self.min_class_recall,
        )

    def health_limits(self) -> Limits:
        """The data health check's limits from these settings."""
        return taken(Limits, self)

    def drift_thresholds(self) -> Thresholds:
        """The gate's drift thresholds from these settings."""
        return taken(Thresholds, self)

    def validate(self) -> "PipelineConfig":
        """Each declared setting's own check, then what settings need of each other and of the files they name."""
        declared_here = [f for f in declared(PipelineConfig) if f.name in PipelineConfig.__annotations__]
        checked(self, declared_here + [f for fields in DECLARED.values() for f in fields], ConfigError)  # --name first
        if self.data:
            try:
                local_or_supported(self.data, f"--data {self.data}")
            except DataError as e:
                raise ConfigError(str(e)) from None
        if self.review:
            self._check_review_file()
        check_beam_args(self.beam_args)
        if self.span_window > 1 and not self.span_pattern:
            raise ConfigError("--span-window needs --span-pattern (e.g. 'span-{SPAN}')")
        if self.confidence_threshold is not None and self.target_precision is not None:
            raise ConfigError(
                "--confidence-threshold and --target-precision: give one (a threshold, or the precision it must reach)"
            )
        self.validate_training()
        return self

    def _check_review_file(self) -> None:
        if not is_remote(self.review) and not os.path.lexists(self.review):
            raise ConfigError(
                f"--review {self.review}: no such file; give the file `imagepipe review` wrote (it says where)"
            )
        review_file.read(self.review)  # a pipe, a device, a folder, a file that is not a review file: one line

    def validate_training(self) -> "PipelineConfig":
        """The training settings together and what they need of the weights, stored images and schema files."""
        if (
            self.weights
            and self.weights != "imagenet"
            and not is_remote(self.weights)
            and not os.path.isfile(self.weights)
        ):
            raise ConfigError(
                f"--weights {self.weights}: no such file; give a weights file (local or gs://), "
                "'imagenet' or '' (random initialisation)"
            )
        if self.weights and self.weights != "imagenet" and not is_remote(self.weights):
            problem = check_weights_file(self.weights)  # before any stage runs: its header, or a .pth read whole
            if problem:
                raise ConfigError(f"--weights {self.weights}: {problem}")
        self.validate_model()
        schema = self.schema_path()
        if schema and not is_remote(schema) and not os.path.isfile(schema):
            raise ConfigError(f"--schema {schema}: no such file; give a schema.pbtxt, or leave it out to infer one")
        return self

    def validate_model(self) -> "PipelineConfig":
        """What depends on the model, checked again once --model auto has chosen (pipeline/model_choice.py): the
        training settings together (HParams names the option) and the stored images' size against its input."""
        try:
            side = self.hparams().validate_together().image_size
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # A JPEG's copy is the largest DCT scale-down within the budget: a quarter of it at worst.
        if self.store_max_pixels and self.store_max_pixels < 8 * side * side:
            raise ConfigError(
                f"--store-max-pixels {self.store_max_pixels:,}: stored copies could be smaller than the "
                f"{side}x{side} model input; use at least {8 * side * side:,} (or 0 to store originals)"
            )
        return self

    def check_memory(self, total_bytes: int) -> None:
        """One-line error when decoding images of up to max_pixels cannot fit in total_bytes of memory."""
        needed = decode_memory_bytes(self.max_pixels) + BASE_MEMORY_BYTES
        if needed > total_bytes:
            raise ConfigError(
                f"--max-pixels {self.max_pixels:,}: decoding images that large takes up to {needed / 2**30:.1f} GiB "
                f"(with TensorFlow and Beam), more than this machine's {total_bytes / 2**30:.1f} GiB; lower "
                "--max-pixels (larger images are then quarantined) or run on a bigger machine"
            )


def check_beam_args(beam_args: List[str]) -> None:
    """Beam's own options parsed here, once: a bad one is one line naming it (Beam's parser printed its 107-line
    usage from inside a component, then failed the run)."""
    if not beam_args:
        return

    with warnings.catch_warnings():  # Google's client libraries warn about Python 3.10 on import
        warnings.simplefilter("ignore")
        # Apache Beam (~2 s): the CLI imports this module at start-up
        from apache_beam.options.pipeline_options import PipelineOptions

    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            PipelineOptions(list(beam_args)).get_all_options()
    except SystemExit:
        reason = next(
            (line.split("error: ", 1)[1] for line in reversed(printed.getvalue().splitlines()) if "error: " in line),
            "not an option Beam accepts",
        )
        raise ConfigError(
            f"--beam-arg {' '.join(beam_args)}: {reason}; see Beam's pipeline options "
            "(python -m apache_beam.examples.wordcount --help lists them)"
        ) from None


def pipelines_in_root(root: str) -> List[str]:
    """The pipelines that have run under `root` (those with an ML Metadata store), sorted."""
    folder = os.path.join(root, "metadata")
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, "metadata.db")))


# Headroom for what TensorFlow, TFX and Beam hold in a component's process besides the images
# being decoded (docs/benchmarks.md's full-size benchmark has the measured peaks).
BASE_MEMORY_BYTES = 3 << 30


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
