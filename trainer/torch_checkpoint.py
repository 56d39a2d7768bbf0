"""Reads a PyTorch state dict saved in the legacy (pre-zip) `torch.save` format, without PyTorch.

The format is five pickles, then the tensors' storages:

    magic number, protocol version, sys info     (checked: a little-endian file of protocol 1001)
    the state dict                                {name: tensor}, each tensor a persistent id of its storage
                                                  with the offset, shape and strides of its view
    the storage keys                              the order the storages follow in
    per storage: its element count (8 bytes, little-endian), then its raw bytes

The unpickler is restricted to the four names such a file needs (an OrderedDict, the tensor rebuild
function and two storage types): a pickle naming anything else is refused, never run. Views are rebuilt
with their stored strides: a converted TensorFlow checkpoint keeps its kernels in TensorFlow's order, so
a tensor's strides are not its shape's (read as contiguous, those kernels load scrambled, without error).
"""

import collections
import pickle
import struct
from typing import BinaryIO, Dict

import numpy as np

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
_STORAGE_TYPES = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
}


class CheckpointError(ValueError):
    """The file is not a legacy torch.save state dict this reader accepts."""


class _View(collections.namedtuple("_View", "storage offset shape strides")):
    """A tensor as the pickle describes it: which storage, and where in it."""


def _rebuild_tensor_v2(storage, offset, shape, strides, requires_grad=False, hooks=None, *rest):
    return _View(storage, offset, tuple(shape), tuple(strides))


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_TYPES:
            return name
        raise CheckpointError(f"it names {module}.{name}, which a state dict of tensors does not need")

    def persistent_load(self, pid):
        # ("storage", storage type, key, location, element count, view metadata)
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and pid[1] in _STORAGE_TYPES):
            raise CheckpointError(f"an unknown persistent id {str(pid)[:80]}")
        return pid[1], str(pid[2]), int(pid[4])


def read_state_dict(stream: BinaryIO) -> Dict[str, np.ndarray]:
    """{name: array} from a legacy torch.save file; CheckpointError (one line) when it is not one."""
    try:
        if _Restricted(stream).load() != MAGIC_NUMBER:
            raise CheckpointError("not a legacy torch.save file (wrong magic number)")
        if _Restricted(stream).load() != PROTOCOL_VERSION:
            raise CheckpointError("an unknown torch.save protocol version")
        info = _Restricted(stream).load()
        if not (isinstance(info, dict) and info.get("little_endian")):
            raise CheckpointError("saved on a big-endian machine")
        state = _Restricted(stream).load()
        keys = _Restricted(stream).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"not a readable torch.save file ({type(e).__name__})") from None
    if not isinstance(state, dict) or not all(
        isinstance(v, _View) and isinstance(v.storage, tuple) and len(v.storage) == 3 for v in state.values()
    ):
        raise CheckpointError("not a state dict of tensors")
    types = {key: (kind, count) for kind, key, count in (view.storage for view in state.values())}
    storages = {}
    left = _bytes_left(stream)
    for key in keys:
        kind, count = types.get(str(key), (None, None))
        if kind is None:
            raise CheckpointError(f"storage {key} belongs to no tensor")
        header = stream.read(8)
        if len(header) != 8 or struct.unpack("<q", header)[0] != count:
            raise CheckpointError(f"storage {key} is cut short or of another size than its tensor says")
        dtype = _STORAGE_TYPES[kind]
        left -= 8
        if not 0 <= count * dtype.itemsize <= left:  # a count the file cannot hold: never allocated
            raise CheckpointError(f"storage {key} is cut short: it claims {count:,} elements, more than the file holds")
        left -= count * dtype.itemsize
        data = stream.read(count * dtype.itemsize)
        if len(data) != count * dtype.itemsize:
            raise CheckpointError(f"storage {key} is cut short")
        storages[str(key)] = np.frombuffer(data, dtype)
    return {name: _materialized(name, view, storages) for name, view in state.items()}


def _bytes_left(stream: BinaryIO) -> int:
    """The bytes from the stream's position to its end."""
    here = stream.tell()
    end = stream.seek(0, 2)
    stream.seek(here)
    return end - here


def _materialized(name: str, view: _View, storages: Dict[str, np.ndarray]) -> np.ndarray:
    """The tensor as an array of its shape, read from its storage with its own offset and strides: every element
    inside the storage, and no dimension of more than one element at stride 0 (a few bytes made into gigabytes)."""
    if not (
        isinstance(view.storage, tuple)
        and isinstance(view.offset, int)
        and all(isinstance(n, int) for n in view.shape + view.strides)
    ):
        raise CheckpointError(f"{name}: a malformed view")
    _, key, _ = view.storage
    flat = storages.get(key)
    if flat is None:
        raise CheckpointError(f"{name}: its storage {key} is missing")
    if (
        len(view.shape) != len(view.strides)
        or any(s < 0 for s in view.shape + view.strides)
        or any(n > 1 and s == 0 for n, s in zip(view.shape, view.strides))
    ):
        raise CheckpointError(f"{name}: a malformed view")
    if all(view.shape):  # not empty: its first and last elements must be in the storage
        last = view.offset + sum((n - 1) * s for n, s in zip(view.shape, view.strides))
        if view.offset < 0 or last >= len(flat):
            raise CheckpointError(f"{name}: its view reaches past its storage")
    item = flat.itemsize
    strided = np.lib.stride_tricks.as_strided(
        flat[view.offset :], shape=view.shape, strides=[s * item for s in view.strides], writeable=False
    )
    return np.array(strided, dtype=flat.dtype.newbyteorder("="))
