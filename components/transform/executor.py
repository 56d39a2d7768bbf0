"""Transform's executor: TFX's, with the Beam settings for large examples (components/beam_settings.py), and
one change to what it writes.

Transform's records stored, not deflated. TFX writes transformed examples as
gzip TFRecords at deflate level 6. Ours are resized pixels, which deflate
shrinks by a quarter at most (photo-like images: 138 MB -> 104 MB) at about
40 MB/s a core: 3.5 s of Transform's work per 2,000 images, and 0.7 s of
inflating in every reader (the features step, the fine-tune phase, DataHealth).
Level 0 ("stored" blocks, as ImageExampleGen writes JPEGs) keeps the same .gz
files every gzip TFRecord reader takes, written and read at memory speed.

Smaller batches. tfx-bsl fills a batch up to 20 MiB of serialized examples (components/beam_settings.py): ~1,000
photo-like JPEGs, whose pixels at 224 px are ~150 MB a batch, copied whole between TensorFlow, Arrow and the
examples (and pickled whole where Beam samples an element's size). At 2 MiB and 256 records a batch, Transform alone
on a 10,000-image run (bench/transform_stage_benchmark.py) held 1.09 GB at its peak against 2.23 and took 0.77x to
0.97x the seconds (docs/benchmarks.md, "Transform and the features step, each alone"), writing the same examples.
"""

import apache_beam as beam
from apache_beam.io import filebasedsink
from apache_beam.io.filesystem import CompressionTypes
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import labels as transform_labels

from components.beam_settings import BeamConfigured, smaller_batches
from images import tfrecord_io


class StoredGzipTFRecordSink(filebasedsink.FileBasedSink):
    """Beam's TFRecord sink, as gzip files of stored (level 0) deflate blocks: tfrecord_io's writer on the file
    Beam opens uncompressed (Beam's own gzip always deflates at level 6)."""

    def __init__(self, file_path_prefix: str, file_name_suffix: str = ".gz"):
        super().__init__(
            file_path_prefix,
            coder=beam.coders.BytesCoder(),
            file_name_suffix=file_name_suffix,
            num_shards=0,
            shard_name_template=None,
            mime_type="application/octet-stream",
            compression_type=CompressionTypes.UNCOMPRESSED,
        )

    def open(self, temp_path):
        return tfrecord_io.GzipTFRecordWriter(super().open(temp_path), level=0)

    def write_encoded_record(self, file_handle, encoded_value):
        file_handle.write(encoded_value)


# A batch of encoded images read for Transform: at most these bytes and records (the docstring's "Smaller batches")
TRANSFORM_BATCH_BYTES = 2 << 20
TRANSFORM_BATCH_RECORDS = 256

_TFX_PROCESSOR = transform_executor.TransformProcessor  # TransformExecutor swaps the module's name during Do


class StoredTransformProcessor(_TFX_PROCESSOR):
    @staticmethod
    @beam.ptransform_fn
    def _EncodeAndWrite(pcoll, schema, file_format: str, output_path: str):  # noqa: N802 - TFX's name
        """TFX's _EncodeAndWrite, writing TFRecords through StoredGzipTFRecordSink."""
        if file_format != transform_labels.FORMAT_TFRECORD:
            return pcoll | _TFX_PROCESSOR._EncodeAndWrite(schema, file_format, output_path)
        return (
            pcoll
            | "EncodeAndSerialize" >> beam.ParDo(_TFX_PROCESSOR._RecordBatchToExamplesFn(schema))  # pylint: disable=protected-access
            | "ExtractExamples" >> beam.Values()
            | "WriteToTFRecord" >> beam.io.Write(StoredGzipTFRecordSink(output_path))
        )


class TransformExecutor(BeamConfigured, transform_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties):
        # TFX's Do makes a TransformProcessor by its module-level name (no hook to pass another): ours is put
        # there while the Beam graph is built, which happens within this call, in this process.
        transform_executor.TransformProcessor = StoredTransformProcessor
        try:
            with smaller_batches(TRANSFORM_BATCH_BYTES, TRANSFORM_BATCH_RECORDS):
                return super().Do(input_dict, output_dict, exec_properties)
        finally:
            transform_executor.TransformProcessor = _TFX_PROCESSOR
