"""TFX's own data components (StatisticsGen, Transform, Evaluator), tuned for examples of megabytes.

Three settings of the libraries underneath, each made in the executor's own process
before it builds its Beam graph, so they hold in the local runner's process and
in every Vertex AI / Kubeflow container (and the Dataflow job each one launches),
and one change to what Transform writes:

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
- Pickling without resetting every logger. Beam wraps each pickle and unpickle
  (every DoFn, coder and transform of a graph: about 7,000 in a small run) in
  dill's `_trace(False)`, which calls `logger.setLevel`, and logging then clears
  the level cache of every logger in the process: thousands once TensorFlow and
  TFX are loaded, ~0.4 ms a call, 3.3 s of a 27 s run on 300 images (profiled).
  The level is only ever set to what it already is, so only a change is passed on
  (components/beam_pickler.py, which ImageExampleGen's executor also uses).
- Transform's records stored, not deflated. TFX writes transformed examples as
  gzip TFRecords at deflate level 6. Ours are resized pixels, which deflate
  shrinks by a quarter at most (photo-like images: 138 MB -> 104 MB) at about
  40 MB/s a core: 3.5 s of Transform's work per 2,000 images, and 0.7 s of
  inflating in every reader (the features step, the fine-tune phase, DataHealth).
  Level 0 ("stored" blocks, as ImageExampleGen writes JPEGs) keeps the same .gz
  files every gzip TFRecord reader takes, written and read at memory speed.
"""

import apache_beam as beam
import google_crc32c
from absl import flags
from apache_beam.io import filebasedsink, tfrecordio
from apache_beam.io.filesystem import CompressionTypes
from tfx.components.evaluator import executor as evaluator_executor
from tfx.components.statistics_gen import executor as statistics_gen_executor
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import labels as transform_labels
from tfx.dsl.components.base import executor_spec
from tfx_bsl.coders import batch_util

from components.beam_pickler import quiet_pickler_trace
from components.image_example_gen import tfrecord_io

BYTE_SIZE_BATCHING_FLAG = "tfxio_use_byte_size_batching"
# What tfx-bsl fills a batch up to, when batching by bytes (its constant).
TARGET_BATCH_BYTES = batch_util._TARGET_BATCH_BYTES_SIZE  # pylint: disable=protected-access


def tune() -> None:
    """Byte-bounded batches and fast TFRecord checksums for the Beam graphs built in this process."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # tfx-bsl reads the flag only once flags are parsed
    flags.FLAGS[BYTE_SIZE_BATCHING_FLAG].value = True
    tfrecordio._default_crc32c_fn.fn = google_crc32c.value  # pylint: disable=protected-access
    quiet_pickler_trace()


class _Tuned:
    """Mixed in before a TFX executor: tune() before its Do builds the Beam graph."""

    def Do(self, input_dict, output_dict, exec_properties):
        tune()
        return super().Do(input_dict, output_dict, exec_properties)


class StatisticsGenExecutor(_Tuned, statistics_gen_executor.Executor):
    pass


class StoredGzipTFRecordSink(filebasedsink.FileBasedSink):
    """Beam's TFRecord sink, as gzip files of stored (level 0) deflate blocks: tfrecord_io's writer on the file
    Beam opens uncompressed (Beam's own gzip always deflates at level 6)."""

    def __init__(self, file_path_prefix: str, file_name_suffix: str = ".gz"):
        super().__init__(file_path_prefix, coder=beam.coders.BytesCoder(), file_name_suffix=file_name_suffix,
                         num_shards=0, shard_name_template=None, mime_type="application/octet-stream",
                         compression_type=CompressionTypes.UNCOMPRESSED)

    def open(self, temp_path):
        return tfrecord_io.GzipTFRecordWriter(super().open(temp_path), level=0)

    def write_encoded_record(self, file_handle, encoded_value):
        file_handle.write(encoded_value)


_TFX_PROCESSOR = transform_executor.TransformProcessor  # TransformExecutor swaps the module's name during Do


class StoredTransformProcessor(_TFX_PROCESSOR):
    @staticmethod
    @beam.ptransform_fn
    def _EncodeAndWrite(pcoll, schema, file_format: str, output_path: str):  # noqa: N802 - TFX's name
        """TFX's _EncodeAndWrite, writing TFRecords through StoredGzipTFRecordSink."""
        if file_format != transform_labels.FORMAT_TFRECORD:
            return pcoll | _TFX_PROCESSOR._EncodeAndWrite(schema, file_format, output_path)
        return (pcoll
                | "EncodeAndSerialize" >> beam.ParDo(
                    _TFX_PROCESSOR._RecordBatchToExamplesFn(schema))  # pylint: disable=protected-access
                | "ExtractExamples" >> beam.Values()
                | "WriteToTFRecord" >> beam.io.Write(StoredGzipTFRecordSink(output_path)))


class TransformExecutor(_Tuned, transform_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties):
        # TFX's Do makes a TransformProcessor by its module-level name (no hook to pass another): ours is put
        # there while the Beam graph is built, which happens within this call, in this process.
        transform_executor.TransformProcessor = StoredTransformProcessor
        try:
            return super().Do(input_dict, output_dict, exec_properties)
        finally:
            transform_executor.TransformProcessor = _TFX_PROCESSOR


class EvaluatorExecutor(_Tuned, evaluator_executor.Executor):
    pass


def tuned(component, executor_class):
    """`component` (a TFX Beam component) running `executor_class` instead of its own executor."""
    component.executor_spec = executor_spec.BeamExecutorSpec(executor_class)
    return component
