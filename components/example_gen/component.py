"""ImageExampleGen: a FileBasedExampleGen for folders of images and CSV manifests.

It keeps FileBasedExampleGen's parameters (input_base, input_config with
{SPAN}/{VERSION} patterns, output_config hash buckets, range_config), so span
resolution works the same locally and on Vertex, and adds:

  outputs['report']   an ImageIngestionReport: summary.json (counts per split,
                      class, format, reason), quarantine.csv (path, reason, detail,
                      label, split) and label_map.json
  seed                files are ingested in an order shuffled with it (never class-folder order, which
                      would reach the Trainer's shuffle buffer one class at a time)
  and each declared ingestion setting (ingest_defaults.Ingestion: layout, max_pixels, store_max_pixels,
  max_bad_fraction, drop_duplicates, near_duplicates, task, review, compression_level, shard_megabytes, and
  span_window: with {SPAN} patterns, the latest span and the span_window - 1 spans before it together)
"""

from typing import Any, Dict, Optional

from tfx import types
from tfx.components.example_gen import driver as example_gen_driver
from tfx.components.example_gen import utils as example_gen_utils
from tfx.components.example_gen.component import FileBasedExampleGen
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.proto import example_gen_pb2, range_config_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.example_gen import executor as image_executor
from components.example_gen import ingest_defaults as defaults
from components.example_gen import ingest_settings
from settings import SEED, kind
from storage.artifact_types import ImageIngestionReport


class ImageExampleGenSpec(standard_component_specs.FileBasedExampleGenSpec):
    PARAMETERS = {
        **standard_component_specs.FileBasedExampleGenSpec.PARAMETERS,
        # each declared ingestion setting (ingest_defaults.Ingestion); a bool travels as an int
        **{f.name: ExecutionParameter(type=kind(f), optional=True) for f in defaults.PARAMETERS},
        ingest_settings.SPAN_PATTERN_KEY: ExecutionParameter(type=str, optional=True),
        ingest_settings.SEED_KEY: ExecutionParameter(type=int, optional=True),
    }
    OUTPUTS = {
        **standard_component_specs.FileBasedExampleGenSpec.OUTPUTS,
        ingest_settings.REPORT_KEY: ChannelParameter(type=ImageIngestionReport),
    }


class ImageFileDriver(example_gen_driver.FileBasedDriver):
    """Resolves spans like FileBasedDriver, but fingerprints the whole folder tree.

    TFX's fingerprint only stats the files a pattern's glob matches; for a folder
    that is the folder itself, so adding, relabelling (moving between class
    folders) or rewriting an image would not invalidate the cache. This one covers
    every file's path, label, size and mtime.
    """

    def resolve_exec_properties(self, exec_properties: Dict[str, Any], pipeline_info, component_info) -> Dict[str, Any]:
        exec_properties = super().resolve_exec_properties(exec_properties, pipeline_info, component_info)
        settings = ingest_settings.IngestSettings.from_exec_properties(exec_properties)
        exec_properties[example_gen_utils.FINGERPRINT_PROPERTY_NAME] = settings.input_fingerprint()
        return exec_properties


class ImageExampleGen(FileBasedExampleGen):
    """Ingests image files into train/eval tf.Examples, quarantining bad files."""

    SPEC_CLASS = ImageExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(image_executor.Executor)
    DRIVER_CLASS = ImageFileDriver

    def __init__(
        self,
        input_base: str,
        input_config: Optional[example_gen_pb2.Input] = None,
        output_config: Optional[example_gen_pb2.Output] = None,
        range_config: Optional[range_config_pb2.RangeConfig] = None,
        seed: int = SEED,
        **settings,
    ):
        """`settings`: any of the declared ingestion settings (ingest_defaults.PARAMETERS), by name; each
        left out takes its declared default."""
        declared = {f.name: f.default for f in defaults.PARAMETERS}
        unknown = sorted(set(settings) - set(declared))
        if unknown:
            raise TypeError(f"ImageExampleGen: no setting {', '.join(unknown)} (ingest_defaults.Ingestion)")
        settings = {**declared, **settings}
        input_config = input_config or example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="single_split", pattern=".")]
        )
        if output_config is None:
            output_config = defaults.hash_split_output() if len(input_config.splits) == 1 else example_gen_pb2.Output()
        spec = ImageExampleGenSpec(
            input_base=input_base,
            input_config=input_config,
            output_config=output_config,
            range_config=range_config,
            custom_config=None,
            output_data_format=example_gen_pb2.FORMAT_TF_EXAMPLE,
            output_file_format=example_gen_pb2.FORMAT_TFRECORDS_GZIP,
            **{name: _parameter(value) for name, value in settings.items()},
            seed=seed,
            # The driver fills {SPAN} into input_config; the window needs the pattern as written (kept whatever
            # the window: span_window may be a runtime parameter of a compiled job).
            span_pattern=input_config.splits[0].pattern if "{SPAN" in input_config.splits[0].pattern else None,
            examples=types.Channel(type=standard_artifacts.Examples),
            report=types.Channel(type=ImageIngestionReport),
        )
        # FileBasedExampleGen.__init__ would build its own spec; skip to the base.
        base_beam_component.BaseBeamComponent.__init__(self, spec=spec)


def _parameter(value):
    """A setting as an exec property: a bool as an int, "" (none given) left out."""
    return int(value) if isinstance(value, bool) else None if value == "" else value
