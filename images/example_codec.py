"""Serialises `tf.train.Example` protos without importing TensorFlow.

Beam workers build one Example per image; importing TF in each worker process
costs seconds, and the proto is tiny. The bytes are identical to
`example.SerializeToString(deterministic=True)` (map keys sorted), which the
tests check against TensorFlow itself.
"""

import functools
from typing import Any, List, Mapping, Sequence, Union

FeatureValue = Union[bytes, str, int, Sequence[Union[bytes, str]], Sequence[int], Any]  # Any: a numpy float array


class BytesValues(tuple):
    """Values of a bytes_list feature, even when there are none (an empty list or tuple is an int64_list)."""


def _varint_slow(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 two's complement, as protobuf encodes it
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_SMALL_VARINTS = [_varint_slow(v) for v in range(1 << 14)]  # tags, lengths, sizes: the common case


def _varint(value: int) -> bytes:
    return _SMALL_VARINTS[value] if 0 <= value < (1 << 14) else _varint_slow(value)


def _header(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(length)


@functools.lru_cache(maxsize=256)
def _key_field(key: str) -> bytes:
    encoded = key.encode("utf-8")
    return _header(1, len(encoded)) + encoded


def _feature_parts(value: FeatureValue) -> List[bytes]:
    """The parts of a Feature message; payloads are not copied until the final join."""
    if hasattr(value, "dtype"):  # a numpy array of floats: Feature.float_list (2) -> FloatList.value (1), packed
        packed = value.astype("<f4", copy=False).tobytes()  # as they are, not one Python float at a time
        inner = _header(1, len(packed)) + packed if packed else b""
        return [_header(2, len(inner)), inner]
    values = value if isinstance(value, (list, tuple)) else (value,)
    if all(isinstance(v, int) for v in values) and not isinstance(value, BytesValues):
        # Feature.int64_list (3) -> Int64List.value (1), packed.
        packed = b"".join(_varint(v) for v in values)
        inner = _header(1, len(packed)) + packed if values else b""
        return [_header(3, len(inner)), inner]
    # Feature.bytes_list (1) -> BytesList.value (1), repeated.
    items: List[bytes] = []
    for v in values:
        data = v.encode("utf-8") if isinstance(v, str) else v
        items += [_header(1, len(data)), data]
    return [_header(1, sum(map(len, items)))] + items


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Returns a serialised tf.train.Example with the given features."""
    # Example.features (1) -> Features.feature (1): one map entry {key (1), value (2)} per feature.
    parts: List[bytes] = []
    for key in sorted(features):
        feature = _feature_parts(features[key])
        feature_len = sum(map(len, feature))
        value_header = _header(2, feature_len)
        key_field = _key_field(key)
        parts += [_header(1, len(key_field) + len(value_header) + feature_len), key_field, value_header]
        parts += feature
    return b"".join([_header(1, sum(map(len, parts)))] + parts)
