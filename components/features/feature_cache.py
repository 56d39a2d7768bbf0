"""The content-addressed cache of backbone features, under the pipeline root (a local folder or gs://).

    <cache root>/<fingerprint>/backbone.weights.h5      the backbone's weights (what the Trainer loads)
    <cache root>/<fingerprint>/features_graph.pb         the same backbone as a frozen graph (what workers run)
    <cache root>/<fingerprint>/info.json                 model, image size, dimension, versions
    <cache root>/<fingerprint>/last_used                 touched by every run that uses it (pruning order)
    <cache root>/<fingerprint>/<k[:2]>/<k>.f32           one image's pooled features, float32 little-endian,
                                                         then the CRC-32 of those bytes
    <cache root>/sources/<source key>.json               which fingerprint a weights file or seed gave
                                                         (backbone.py: later runs need not make the backbone)

The fingerprint covers everything the features depend on besides the pixels: the backbone, the
hash of its weights as loaded (another --weights file, or other random weights, is another
fingerprint), the scaling in front of it, the input size, and the TensorFlow and Keras versions.
The entry key is the SHA-256 of the image's resized pixels (what the backbone sees, so it also
covers the image bytes, the resize and the decoding), suffixed for an augmented view.

An entry is a file of its own: a local read or write costs tens of microseconds. On an object store
each is a request of tens of milliseconds, so get_many() and put_many() keep IO_THREADS of them in
flight at once.

Safe to share: entries are written under a temporary name and renamed (an object store writes an
object whole), so no half-written entry is ever read; two pipelines writing the same key write the
same bytes; an entry of the wrong length, whose checksum does not match (a damaged disk, a copy gone wrong) or
holding a value that is not finite is computed again. `prune()` bounds the cache by dropping
the least recently used fingerprints; `imagepipe cache` shows and clears it.
"""

import errno
import json
import os
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

import numpy as np

from storage import files as fs

WEIGHTS_FILE = "backbone.weights.h5"
GRAPH_FILE = "features_graph.pb"
INFO_FILE = "info.json"
LAST_USED = "last_used"
ENTRY_SUFFIX = ".f32"
SOURCES_DIR = "sources"
FORMAT_VERSION = 2  # bump when what an entry holds changes (2: the CRC-32 after the vector)
IO_THREADS = 32  # entries read or written at once on an object store


class FeatureCache:
    """The entries of one fingerprint: get and put float32 vectors of `dim` values by key."""

    def __init__(self, root: str, fingerprint: str, dim: int):
        self.folder = fs.join(root, fingerprint)
        self.dim = dim
        self._pool = ThreadPoolExecutor(IO_THREADS) if fs.is_remote(root) else None

    def _path(self, key: str) -> str:
        return fs.join(self.folder, key[:2], key + ENTRY_SUFFIX)

    def get(self, key: str) -> Optional[np.ndarray]:
        """The cached vector, or None (missing, not whole, damaged or not finite: computed again)."""
        try:
            data = fs.read_bytes(self._path(key))
        except Exception:  # noqa: BLE001 - missing locally (FileNotFoundError) or remotely (the store's own types)
            return None
        if len(data) != 4 * self.dim + 4 or zlib.crc32(data[:-4]).to_bytes(4, "little") != data[-4:]:
            return None
        vector = np.frombuffer(data[:-4], dtype="<f4")
        return vector if np.isfinite(vector).all() else None

    def put(self, key: str, vector: np.ndarray) -> None:
        data = np.asarray(vector, dtype="<f4").tobytes()
        write_whole(self._path(key), data + zlib.crc32(data).to_bytes(4, "little"))

    def get_many(self, keys: Sequence[str]) -> List[Optional[np.ndarray]]:
        return list(self._pool.map(self.get, keys)) if self._pool else [self.get(k) for k in keys]

    def close(self) -> None:
        """Ends the remote IO threads (a DoFn's teardown)."""
        if self._pool:
            self._pool.shutdown()

    def put_many(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        if self._pool:
            list(self._pool.map(self.put, keys, vectors))
        else:
            for key, vector in zip(keys, vectors):
                self.put(key, vector)


class CacheError(RuntimeError):
    """The features cache cannot be used as it is; one line naming the folder and the fix."""


def write_whole(path: str, data: bytes) -> None:
    """Writes a file that readers see whole or not at all: a local file through a temporary name and a
    rename; an object store object, which appears only once its upload completes."""
    if fs.is_remote(path):
        fs.write_bytes(path, data)
        return
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise  # a full disk: the run's own message says so (cli/run.py)
        raise CacheError(f"the features cache cannot be written at {os.path.dirname(path)} ({e.strerror}): make the "
                         "folder writable, or run with another --root (the cache is <root>/cache/features)") from None


def touch(root: str, fingerprint: str) -> None:
    """Marks the fingerprint as used now (prune() drops the least recently used first)."""
    write_whole(fs.join(root, fingerprint, LAST_USED), str(time.time()).encode())


def read_info(root: str, fingerprint: str) -> Dict:
    return json.loads(fs.read_bytes(fs.join(root, fingerprint, INFO_FILE)))


def describe(root: str) -> List[Dict]:
    """Each fingerprint under a local cache root: its info, entries, bytes and when it was last used."""
    found = []
    if not os.path.isdir(root):
        return found
    for fingerprint in sorted(os.listdir(root)):
        folder = os.path.join(root, fingerprint)
        if not os.path.isdir(folder) or fingerprint == SOURCES_DIR:
            continue
        entries = size = 0
        for path, _, names in os.walk(folder):
            for name in names:
                size += os.path.getsize(os.path.join(path, name))
                entries += name.endswith(ENTRY_SUFFIX)
        try:
            info = read_info(root, fingerprint)
        except (OSError, ValueError):
            info = {}
        try:
            last_used = float(open(os.path.join(folder, LAST_USED)).read())
        except (OSError, ValueError):
            last_used = os.path.getmtime(folder)
        found.append({"fingerprint": fingerprint, "entries": entries, "bytes": size, "last_used": last_used,
                      **{k: info.get(k) for k in ("model", "image_size", "dim", "weights")}})
    return found


STALE_SECONDS = 3600  # a temporary file this old is left by an interrupted write, not one in progress


def prune(root: str, max_bytes: int) -> List[Dict]:
    """Removes the least recently used fingerprints of a local cache root until it holds at most max_bytes
    (0: everything); returns what was removed. Temporary files of interrupted writes go too. (A note in
    sources/ of a removed fingerprint is ignored by the next run, which makes the backbone again.)"""
    import shutil

    kept = sorted(describe(root), key=lambda d: d["last_used"], reverse=True)
    removed, total = [], sum(d["bytes"] for d in kept)
    while kept and total > max_bytes:
        oldest = kept.pop()
        shutil.rmtree(os.path.join(root, oldest["fingerprint"]), ignore_errors=True)
        total -= oldest["bytes"]
        removed.append(oldest)
    if not kept:
        shutil.rmtree(os.path.join(root, SOURCES_DIR), ignore_errors=True)
    for d in kept:
        for path, _, names in os.walk(os.path.join(root, d["fingerprint"])):
            for name in names:
                if ".tmp-" in name and time.time() - os.path.getmtime(os.path.join(path, name)) > STALE_SECONDS:
                    os.remove(os.path.join(path, name))
    return removed
