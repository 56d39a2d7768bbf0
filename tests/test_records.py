"""Our TF-free Example encoder and gzip TFRecord writer produce what TensorFlow reads."""

import io
import os
import zlib

import pytest
import tensorflow as tf

from images import tfrecord_io
from images.example_codec import encode_example


def _tf_example(features):
    def feature(value):
        values = value if isinstance(value, list) else [value]
        if all(isinstance(v, int) for v in values):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[v.encode() if isinstance(v, str) else v for v in values])
        )

    return tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features.items()}))


@pytest.mark.parametrize(
    "features",
    [
        {"image/encoded": bytes(range(256)) * 300, "image/height": 300, "image/class/text": "chat é"},
        {"big": 2**40, "negative": -5, "zero": 0, "many": [1, 2, 300_000], "empty": []},
        {"strings": ["a", b"\x00\xff", ""], "unicode key é": "x"},
    ],
)
def test_encoding_is_byte_identical_to_tensorflow(features):
    assert encode_example(features) == _tf_example(features).SerializeToString(deterministic=True)


def test_float_arrays_are_packed_float_lists_as_tensorflow_writes_them():
    import numpy as np

    vector = np.random.default_rng(0).normal(size=1280).astype(np.float32)
    expected = tf.train.Example(
        features=tf.train.Features(
            feature={
                "features": tf.train.Feature(float_list=tf.train.FloatList(value=vector)),
                "none": tf.train.Feature(float_list=tf.train.FloatList(value=[])),
            }
        )
    )
    assert encode_example({"features": vector, "none": np.zeros(0, np.float64)}) == expected.SerializeToString(
        deterministic=True
    )


@pytest.mark.parametrize("level", [0, 6])
def test_gzip_tfrecords_are_read_by_tensorflow(tmp_path, level):
    records = [b"", b"x", os.urandom(100_000), b"last"]
    path = str(tmp_path / "data.gz")
    writer = tfrecord_io.GzipTFRecordWriter(open(path, "wb"), level)
    for r in records:
        writer.write(r)
    writer.close()
    assert [r.numpy() for r in tf.data.TFRecordDataset([path], compression_type="GZIP")] == records
    with open(path, "rb") as f:
        assert list(tfrecord_io.read_gzip_tfrecords(f, chunk_size=1000)) == records


def test_level_zero_stores_and_level_six_compresses(tmp_path):
    compressible = b"a" * 100_000
    sizes = {}
    for level in (0, 6):
        out = io.BytesIO()
        out.close = lambda: None  # keep the buffer readable after the writer closes it
        writer = tfrecord_io.GzipTFRecordWriter(out, level)
        writer.write(compressible)
        writer.close()
        sizes[level] = len(out.getvalue())
    assert sizes[0] > 100_000 > 10 * sizes[6]


def test_reader_detects_corruption(tmp_path):
    path = str(tmp_path / "data.gz")
    writer = tfrecord_io.GzipTFRecordWriter(open(path, "wb"), 0)
    writer.write(b"payload" * 100)
    writer.close()
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0xFF  # inside the stored record
    with pytest.raises((ValueError, zlib.error)):  # our record CRC, or gzip's own CRC
        list(tfrecord_io.read_gzip_tfrecords(io.BytesIO(bytes(data))))
