"""Beam settings for TFX's own data executors (StatisticsGen, Transform, the Evaluator) on examples of megabytes.

Three settings of the libraries underneath, each made in the executor's own process
before it builds its Beam graph, so they hold in the local runner's process and
in every Vertex AI / Kubeflow container (and the Dataflow job each one launches).
Each stage's executor mixes in `BeamConfigured` (components/validation/statistics.py,
components/transform/executor.py, components/evaluator/executor.py):

- Batches bounded by bytes. tfx-bsl batches examples by count, tuning the count
  up to 1,000 a batch. At a few KB an image that is a few MB; at 3 MB a phone
  photo it is 3 GB, which Beam's in-process runner moves between stages as one
  gRPC message (2 GiB at most: "Buffer size ... exceeds GRPC limit"). tfx-bsl's
  byte-size batching (its absl flag `tfxio_use_byte_size_batching`) fills a batch
  up to 20 MiB of serialized examples instead (at most 8,192 of them): small
  images still travel in large batches, photos in a handful.
- Fast TFRecord checksums. Beam's TFRecord reader checks every record's CRC-32C
  with crcmod (~400 MB/s here), a quarter of StatisticsGen's time on photos;
  Beam takes any CRC-32C function in `tfrecordio._default_crc32c_fn.fn`, and
  google-crc32c's hardware one runs at several GB/s.
- Beam's costs for every transform of a graph, cut: pickling without resetting
  every logger, and each function's signature computed once
  (components/beam_overheads.py, which ImageExampleGen's executor also uses).
"""

import contextlib

import google_crc32c
import numpy as np
from absl import flags
from apache_beam.io import tfrecordio
from tfx.dsl.components.base import executor_spec
from tfx_bsl.coders import batch_util

from components.beam_dependencies import NoTfxPackageForLocalRunners
from components.beam_overheads import cut_overheads

BYTE_SIZE_BATCHING_FLAG = "tfxio_use_byte_size_batching"
# What tfx-bsl fills a batch up to, when batching by bytes (its constant).
TARGET_BATCH_BYTES = batch_util._TARGET_BATCH_BYTES_SIZE  # pylint: disable=protected-access


def configure_beam() -> None:
    """Byte-bounded batches and fast TFRecord checksums for the Beam graphs built in this process."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # tfx-bsl reads the flag only once flags are parsed
    flags.FLAGS[BYTE_SIZE_BATCHING_FLAG].value = True
    tfrecordio._default_crc32c_fn.fn = google_crc32c.value  # pylint: disable=protected-access
    cut_overheads()


class BeamConfigured(NoTfxPackageForLocalRunners):
    """Mixed in before a TFX executor: configure_beam() before its Do builds the Beam graph (and no TFX package built
    for a runner on this machine, components/beam_dependencies.py)."""

    def Do(self, input_dict, output_dict, exec_properties):
        configure_beam()
        return super().Do(input_dict, output_dict, exec_properties)


# The Evaluator decodes each batch it reads whole (the model's transform_features, TFMA's preprocessing): 20 MiB of
# small JPEGs is thousands of images, float32 at the model's input (10,000 photo-like images at 224 px: the run's
# peak, 4.5 GB). Its batches are bounded by count too (and its model called on eval_config.INFERENCE_BATCH images).
EVALUATOR_BATCH_BYTES = 8 << 20
EVALUATOR_BATCH_RECORDS = 256


@contextlib.contextmanager
def smaller_batches(batch_bytes: int = EVALUATOR_BATCH_BYTES, records: int = EVALUATOR_BATCH_RECORDS):
    """tfx-bsl's byte-bounded batches, at most `batch_bytes` and `records`, while the block builds a Beam graph (its
    batching reads these two constants then); restored after (the local runner's other stages share the process)."""
    before = batch_util._TARGET_BATCH_BYTES_SIZE, batch_util._BATCH_SIZE_CAP_WITH_BYTE_TARGET  # noqa: SLF001
    batch_util._TARGET_BATCH_BYTES_SIZE, batch_util._BATCH_SIZE_CAP_WITH_BYTE_TARGET = batch_bytes, records
    try:
        yield
    finally:
        batch_util._TARGET_BATCH_BYTES_SIZE, batch_util._BATCH_SIZE_CAP_WITH_BYTE_TARGET = before


def _size(value) -> str:
    return f"<{len(value):,} bytes>" if isinstance(value, bytes) else repr(value)


@contextlib.contextmanager
def bytes_printed_as_sizes():
    """While the block runs, numpy prints each bytes value of an array of objects (a TensorFlow string tensor's) as its
    size. TFMA calls the exported model's signature with a batch of serialized examples as one positional argument;
    TensorFlow first binds it to the signature's keyword arguments, fails, and writes the whole batch into that
    TypeError's message (discarded: it then calls the signature by position): each batch of up to
    EVALUATOR_BATCH_BYTES printed byte by byte (0.05 s for 1.8 MB of JPEGs; random bytes 0.25 s a MB). numpy's print
    options are its process's (numpy 1) or this thread's (numpy 2): the in-process DirectRunner runs TFMA's DoFns in
    this thread on both stacks."""
    with np.printoptions(formatter={"object": _size}):
        yield


def with_executor(component, executor_class):
    """`component` (a TFX Beam component) running `executor_class` instead of its own executor."""
    component.executor_spec = executor_spec.BeamExecutorSpec(executor_class)
    return component
