"""How PipelineConfig's data settings map onto ImageExampleGen's TFX configuration.

Kept apart from pipeline.py (which imports TFX) so the CLI can check input fast.
"""

import os
import posixpath

from tfx.proto import example_gen_pb2

from components.example_gen.ingest_defaults import hash_split_output
from pipeline.config import PipelineConfig
from storage.files import is_remote


def example_gen_input(config: PipelineConfig) -> example_gen_pb2.Input:
    """The input pattern below input_base: the data itself, or its latest span folder or file."""
    data = config.data_path()
    if config.span_pattern:
        pattern = config.span_pattern
    elif is_manifest(data):
        pattern = posixpath.basename(data)  # a CSV manifest: input_base is its folder
    else:
        pattern = "."
    return example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=pattern)])


def is_manifest(data: str) -> bool:
    """A manifest or an AutoML import file: one file naming the images (its folder is ImageExampleGen's base)."""
    return data.lower().endswith((".csv", ".jsonl")) if is_remote(data) else os.path.isfile(data)


def example_gen_base(config: PipelineConfig) -> str:
    data = config.data_path()
    if is_manifest(data) and not config.span_pattern:
        return posixpath.dirname(data) if is_remote(data) else os.path.dirname(data)
    return data


def review_file(config: PipelineConfig) -> str:
    """The review file ImageExampleGen applies, absolute ("" for none): the executor may run in another folder."""
    if not config.review or is_remote(config.review):
        return config.review
    return os.path.abspath(os.path.expanduser(config.review))


def example_gen_output(config: PipelineConfig) -> example_gen_pb2.Output:
    """Hash buckets in percent: train (100 - eval_percent) / eval (eval_percent)."""
    return hash_split_output(config.eval_percent)
