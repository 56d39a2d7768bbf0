"""Every setting of the pipeline, and its checks (the training settings and data health's limits are declared where
their code reads them: trainer/hparams.py, components/health; their fields are made here from those declarations).

`PipelineConfig` holds the defaults; the CLI (`imagepipe run --...`) and the
environment (`IMAGEPIPE_<FIELD>`) override them. `create_pipeline(config, platform)` is
the DAG's only consumer, shared by every runner; each runner makes the platform (pipeline/platform.py).
"""

import dataclasses
import hashlib
import os
import re
from typing import List, Optional

from components.evaluator.explanations import LIMIT as EXPLANATIONS
from components.example_gen import ingest_defaults
from components.health import LABEL_CHECKS, Limits
from components.tuner import MODES as TUNE_MODES
from storage.errors import ConfigError, DataError  # raised here, caught as pipeline.config.ConfigError too
from storage.files import is_remote, local_or_supported
from trainer.class_balance import MIN_CLASS_RECALL
from trainer.decode_memory import decode_memory_bytes
from trainer.hparams import DEFAULT_IMAGE_SIZE, HParams

# The repository root: schemas/ and the default run's outputs are found from here.
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_SCHEMA = os.path.join(PROJECT_DIR, "schemas", "digits", "schema.pbtxt")

GATE_MODES = ("fail", "warn")
MAX_TRIALS = 1000
NEAR_DUPLICATE_MODES = ingest_defaults.NEAR_DUPLICATE_MODES
TASKS = ingest_defaults.TASKS
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


def _declared(name: str, fields: List[dataclasses.Field]):
    """A dataclass of these declared settings (trainer/hparams.py: setting()), each with its name, default and
    help, as a base of PipelineConfig: a setting is declared once, where its code reads it."""
    return dataclasses.make_dataclass(
        name, [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata)) for f in fields]
    )


TrainingSettings = _declared("TrainingSettings", HParams.user_settings())
HealthLimits = _declared("HealthLimits", dataclasses.fields(Limits))  # data health's limits (components/health)


@dataclasses.dataclass
class PipelineConfig(HealthLimits, TrainingSettings):
    # The pipeline name: its runs, artifacts, metadata and pushed models are kept apart from other
    # pipelines'. None: derived from --data (default_pipeline_name), so each dataset has its own.
    name: Optional[str] = None
    # Where runs write: pipelines/<name> (artifacts), metadata/<name>/metadata.db (ML Metadata),
    # data/ (the sample dataset).
    root: str = os.path.join(PROJECT_DIR, ".imagepipe")
    # A folder of class subfolders (optionally train/ and eval/ inside), or a CSV manifest
    # with a path,label[,split] header. None: the bundled digits sample, made on first use.
    data: Optional[str] = None
    layout: str = ingest_defaults.LAYOUT  # auto | folders | presplit | manifest
    # Span pattern below `data` for new data drops, e.g. "span-{SPAN}": the latest span is read,
    # with the span_window - 1 spans before it.
    span_pattern: Optional[str] = None
    span_window: int = ingest_defaults.SPAN_WINDOW
    # Ingestion (components/example_gen/ingest_defaults.py has the meaning of each).
    eval_percent: int = ingest_defaults.EVAL_PERCENT
    max_pixels: int = ingest_defaults.MAX_PIXELS
    store_max_pixels: int = ingest_defaults.STORE_MAX_PIXELS
    max_bad_fraction: float = ingest_defaults.MAX_BAD_FRACTION
    drop_duplicates: bool = ingest_defaults.DROP_DUPLICATES
    near_duplicates: str = ingest_defaults.NEAR_DUPLICATES  # report | drop
    task: str = ingest_defaults.TASK  # auto | single | multi (multi-label)
    review: str = ""  # a review file (`imagepipe review`): its relabels and exclusions apply, by content hash
    compression_level: int = ingest_defaults.COMPRESSION_LEVEL
    # A curated schema (schemas/<dataset>/schema.pbtxt) for ImportSchemaGen; None: SchemaGen infers.
    schema: Optional[str] = None
    gate: str = "fail"  # fail: anomalies or drift stop the run; warn: they are reported only
    # Drift from the data of the latest blessed model (components/drift.py): the largest accepted
    # L-infinity distance between the shares of classes, of image width/height bins, and of formats,
    # and the largest accepted drop of the example count (0.5: half). 1 turns a check off.
    max_class_drift: float = 0.2
    max_size_drift: float = 0.3
    max_format_drift: float = 0.3
    max_count_drop: float = 0.5
    # Data health (components/health): the label check (auto: on for the transfer models, whose
    # backbone features make it cheap; on: also a k-fold cnn on pixels; off); its limits are HealthLimits (above).
    label_check: str = "auto"

    # Why the model is the one it is when --model auto chose it (pipeline/model_choice.py sets it; "" otherwise).
    model_choice: str = ""
    # Training: the settings trainer/hparams.py declares (TrainingSettings, above), but for the input side:
    image_size: Optional[int] = None  # None: 32 for the digits sample, else the model's usual size
    # Split this machine's CPU into this many logical devices and train across them (MirroredStrategy): the
    # multi-replica code runs for real without accelerators (tests, debugging); no faster.
    cpu_replicas: int = 1
    # Hyperparameter search (components/tuner, trainer/search.py): trials per search, 0 for no search step.
    # tune_mode "search": this run searches (`imagepipe run --tune N`, --retune); "auto": only when the data
    # or settings moved since the last search, else its best values are reused (compiled jobs; local runs
    # of a pipeline that searched before).
    tune: int = 0
    tune_mode: str = "auto"
    # Evaluator: bless a model when eval accuracy reaches this, and (after the first) when it is
    # no worse than the last blessed model. Pusher copies blessed models under <root>/serving/<name>.
    accuracy_threshold: float = 0.9
    # ... and when every class with at least class_balance.MIN_EVAL_EXAMPLES eval images reaches this recall
    # (a model that misses a class is never blessed, whatever its accuracy).
    min_class_recall: float = MIN_CLASS_RECALL
    # The confidence threshold that goes with the model (imagepipe predict answers "unsure" at or below it): this
    # one, or the lowest at which the eval split's precision reaches target_precision; none by default.
    confidence_threshold: Optional[float] = None
    target_precision: Optional[float] = None
    # Eval images the Evaluator explains for the report (where the model looked: components/evaluator/explanations.py);
    # 0: none.
    explanations: int = EXPLANATIONS
    enable_cache: bool = True
    beam_args: List[str] = dataclasses.field(default_factory=list)  # e.g. Dataflow settings

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
        size = (
            self.image_size
            if self.image_size is not None
            else (32 if self.uses_sample_data else DEFAULT_IMAGE_SIZE.get(self.model, HParams.image_size))
        )
        given = {f.name: getattr(self, f.name) for f in HParams.user_settings()}
        return HParams(**{**given, "image_size": size, "model_choice": self.model_choice})

    def health_limits(self) -> Limits:
        """The data health check's limits from these settings."""
        return Limits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Limits)})

    def drift_thresholds(self):
        """The gate's drift thresholds (components.drift.Thresholds) from these settings."""
        from components.drift import Thresholds

        return Thresholds(**{field: getattr(self, field) for field in Thresholds._fields})

    def validate(self) -> "PipelineConfig":
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", self.name):
            raise ConfigError(
                f"--name {self.name!r}: use letters, digits, '-', '_' or '.' (at most 63), "
                "starting with a letter or digit"
            )
        if self.data:
            try:
                local_or_supported(self.data, f"--data {self.data}")
            except DataError as e:
                raise ConfigError(str(e)) from None
        self._validate_ingestion()
        check_beam_args(self.beam_args)
        self._validate_checks()
        self._validate_spans()
        self._validate_evaluation()
        self._validate_training()
        return self

    def _validate_ingestion(self) -> None:
        if self.layout not in ingest_defaults.LAYOUTS:
            raise ConfigError(f"--layout {self.layout!r}: use one of {', '.join(ingest_defaults.LAYOUTS)}")
        if not 1 <= self.eval_percent <= 99:
            raise ConfigError(f"--eval-percent {self.eval_percent}: use a whole number from 1 to 99")
        if not 0 <= self.max_bad_fraction <= 1:
            raise ConfigError(f"--max-bad-fraction {self.max_bad_fraction}: use a fraction from 0 to 1")
        if self.max_pixels < 1:
            raise ConfigError(f"--max-pixels {self.max_pixels}: use a positive number of pixels")
        if self.store_max_pixels < 0:
            raise ConfigError(
                f"--store-max-pixels {self.store_max_pixels}: use a number of pixels, or 0 to store every original"
            )
        if self.near_duplicates not in NEAR_DUPLICATE_MODES:
            raise ConfigError(f"--near-duplicates {self.near_duplicates!r}: use {' or '.join(NEAR_DUPLICATE_MODES)}")
        if self.task not in TASKS:
            raise ConfigError(f"--task {self.task!r}: use {', '.join(TASKS)}")
        if not 0 <= self.compression_level <= 9:
            raise ConfigError(f"--compression-level {self.compression_level}: use 0 (none) to 9")
        if self.review:
            from storage import review_file

            if not is_remote(self.review) and not os.path.isfile(self.review):
                raise ConfigError(
                    f"--review {self.review}: no such file; give the file `imagepipe review` wrote (it says where)"
                )
            review_file.read(self.review)  # a file that is not a review file: one line

    def _validate_checks(self) -> None:
        """The gate, drift and data health settings."""
        if self.gate not in GATE_MODES:
            raise ConfigError(f"--gate {self.gate!r}: use fail or warn")
        for option, value in self.drift_thresholds()._asdict().items():
            if not 0 <= value <= 1:
                raise ConfigError(f"--{option.replace('_', '-')} {value}: use a fraction from 0 to 1 (1: no check)")
        if self.label_check not in LABEL_CHECKS:
            raise ConfigError(f"--label-check {self.label_check!r}: use {', '.join(LABEL_CHECKS)}")
        try:
            self.health_limits().validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None  # Limits names the option

    def _validate_spans(self) -> None:
        if self.span_window < 1:
            raise ConfigError(f"--span-window {self.span_window}: use 1 or more spans")
        if self.span_window > 1 and not self.span_pattern:
            raise ConfigError("--span-window needs --span-pattern (e.g. 'span-{SPAN}')")
        if self.span_pattern is not None and "{SPAN}" not in self.span_pattern:
            raise ConfigError(f"--span-pattern {self.span_pattern!r}: it must contain {{SPAN}}, e.g. span-{{SPAN}}")

    def _validate_evaluation(self) -> None:
        """The CPU split, the search, and what blesses a model."""
        if not 1 <= self.cpu_replicas <= MAX_CPU_REPLICAS:
            raise ConfigError(f"--cpu-replicas {self.cpu_replicas}: use 1 to {MAX_CPU_REPLICAS} logical CPU devices")
        if not 0 <= self.tune <= MAX_TRIALS:
            raise ConfigError(f"--tune {self.tune}: use a number of trials from 1 to {MAX_TRIALS:,} (0: no search)")
        if self.tune_mode not in TUNE_MODES:
            raise ConfigError(
                f"tune mode {self.tune_mode!r} (IMAGEPIPE_TUNE_MODE; --retune sets it to search): use "
                f"{' or '.join(TUNE_MODES)}"
            )
        for option, value in (
            ("confidence-threshold", self.confidence_threshold),
            ("target-precision", self.target_precision),
        ):
            if value is not None and not 0 <= value < 1:
                raise ConfigError(f"--{option} {value}: use a fraction from 0 to below 1")
        if self.confidence_threshold is not None and self.target_precision is not None:
            raise ConfigError(
                "--confidence-threshold and --target-precision: give one (a threshold, or the precision it must reach)"
            )
        if not 0 <= self.accuracy_threshold <= 1:
            raise ConfigError(f"--accuracy-threshold {self.accuracy_threshold}: use a fraction from 0 to 1")
        if self.explanations < 0:
            raise ConfigError(f"--explanations {self.explanations}: give a number of eval images (0: none)")
        if not 0 <= self.min_class_recall <= 1:
            raise ConfigError(f"--min-class-recall {self.min_class_recall}: use a fraction from 0 to 1 (0: no check)")

    def _validate_training(self) -> None:
        """The training settings (HParams names the option), and what they need of the stored images and schema."""
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
        try:
            side = self.hparams().validate().image_size
        except ValueError as e:
            raise ConfigError(str(e)) from None  # HParams names the option
        # A JPEG's copy is the largest DCT scale-down within the budget: a quarter of it at worst.
        if self.store_max_pixels and self.store_max_pixels < 8 * side * side:
            raise ConfigError(
                f"--store-max-pixels {self.store_max_pixels:,}: stored copies could be smaller than the "
                f"{side}x{side} model input; use at least {8 * side * side:,} (or 0 to store originals)"
            )
        schema = self.schema_path()
        if schema and not is_remote(schema) and not os.path.isfile(schema):
            raise ConfigError(f"--schema {schema}: no such file; give a schema.pbtxt, or leave it out to infer one")

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
    import contextlib
    import io
    import warnings

    with warnings.catch_warnings():  # Google's client libraries warn about Python 3.10 on import
        warnings.simplefilter("ignore")
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
