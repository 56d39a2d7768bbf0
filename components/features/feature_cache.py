"""The content-addressed cache of backbone features, under the pipeline root (a local folder or gs://).

    <cache root>/<fingerprint>/backbone.weights.h5      the backbone's weights (BackboneFeatures copies them into
                                                         its artifact, where the Trainer loads them)
    <cache root>/<fingerprint>/features_graph.pb         the same backbone as a frozen graph (what workers run)
    <cache root>/<fingerprint>/features_graph.sha256     its digest: a graph that differs is made again
    <cache root>/<fingerprint>/info.json                 model, image size, dimension, versions
    <cache root>/<fingerprint>/last_used                 touched by every run that uses it (pruning order)
    <cache root>/<fingerprint>/packs/<id>.pack           the features of one batch of images (Pack)
    <cache root>/sources/<source key>.json               which fingerprint a weights file or seed gave
                                                         (backbone.py: later runs need not make the backbone)

The fingerprint covers everything the features depend on besides the pixels: the backbone, the
hash of its weights as loaded (another --weights file, or other random weights, is another
fingerprint), the scaling in front of it, the input size, the TensorFlow and Keras versions and
this file's FORMAT_VERSION. An entry's key is the SHA-256 of the image's resized pixels (what the
backbone sees, so it also covers the image bytes, the resize and the decoding), suffixed for an
augmented view.

Packed, not a file an entry: at ten million images, an object per image and view was tens of
millions of objects, a request each on every rerun. A worker writes the entries of one batch into one
pack; a run reads every pack's keys once (its index: 40 bytes an entry in each worker process, about 90 while it is sorted) and
then, per batch, each pack it needs in one ranged read of the span it needs (a rerun's batches are
the first run's, so that is a pack or two a batch).

Safe to share: packs are written under a temporary name and renamed (an object store writes an
object whole), never changed, so no half-written pack is ever read; two pipelines writing the same
key write the same bytes; a pack cut short, an entry whose checksum does not match (a damaged disk, a
copy gone wrong) or holding a value that is not finite is computed again. `prune()` bounds the cache by
dropping the least recently used fingerprints; `imagepipe cache` shows and clears it, on disk or gs://.
"""

import collections
import errno
import hashlib
import json
import os
import shutil
import struct
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from storage import files as fs

WEIGHTS_FILE = "backbone.weights.h5"
GRAPH_FILE = "features_graph.pb"
GRAPH_DIGEST_FILE = "features_graph.sha256"  # the graph's SHA-256, written after it: a graph that differs is not used
ONNX_FILE = "features_graph.onnx"  # the graph converted for ONNX Runtime, kept once it agreed with TensorFlow
# SHA-256 of the graph's digest and the ONNX model, written after it: one converted from another graph is not used
ONNX_DIGEST_FILE = "features_graph.onnx.sha256"
INFO_FILE = "info.json"
LAST_USED = "last_used"
PACKS_DIR = "packs"
PACK_SUFFIX = ".pack"
SOURCES_DIR = "sources"
FORMAT_VERSION = 3  # bump when what an entry holds changes (2: the CRC-32 after the vector; 3: packs)
IO_THREADS = 32  # packs read at once on an object store
READ_GAP = 64 << 10  # entries of one pack this close are read in one request (the bytes between included)


class Pack:
    """One pack's bytes: MAGIC, dim and n (uint32 little-endian), the CRC-32 of the keys, the n keys (each the
    SHA-256 of an entry's name), then per entry its float32 little-endian vector and the CRC-32 of its bytes."""

    MAGIC = b"IPF3"
    HEADER = 16

    @staticmethod
    def encode(digests: Sequence[bytes], vectors: np.ndarray) -> bytes:
        vectors = np.asarray(vectors, dtype="<f4")
        keys = b"".join(digests)
        parts = [Pack.MAGIC, struct.pack("<III", vectors.shape[1], len(digests), zlib.crc32(keys)), keys]
        for vector in vectors:
            data = vector.tobytes()
            parts += [data, zlib.crc32(data).to_bytes(4, "little")]
        return b"".join(parts)

    @staticmethod
    def entry_bytes(dim: int) -> int:
        return 4 * dim + 4

    @staticmethod
    def offset(dim: int, n: int, i: int) -> int:
        return Pack.HEADER + 32 * n + i * Pack.entry_bytes(dim)

    @staticmethod
    def entries_in(size: int, dim: int) -> int:
        """The entries a whole pack of `size` bytes holds."""
        return max(0, size - Pack.HEADER) // (32 + Pack.entry_bytes(dim))

    @staticmethod
    def vector(data: bytes, dim: int) -> Optional[np.ndarray]:
        """An entry's vector, or None (cut short, its checksum wrong, or not finite)."""
        if len(data) != Pack.entry_bytes(dim) or zlib.crc32(data[:-4]).to_bytes(4, "little") != data[-4:]:
            return None
        vector = np.frombuffer(data[:-4], dtype="<f4")
        return vector if np.isfinite(vector).all() else None


def digest(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


class Index(NamedTuple):
    """The keys of every pack a run found, sorted: where each entry is."""

    digests: np.ndarray  # S32, sorted
    pack: np.ndarray  # int32: the pack's number in `packs`
    position: np.ndarray  # int32: the entry's number in its pack
    packs: List[Tuple[str, int]]  # (path, entries)

    def find(self, wanted: Sequence[bytes]) -> List[Optional[Tuple[int, int]]]:
        if not len(self.digests):
            return [None] * len(wanted)
        query = np.array(wanted, dtype="S32")
        at = np.minimum(np.searchsorted(self.digests, query), len(self.digests) - 1)
        hit = self.digests[at] == query
        return [(int(self.pack[i]), int(self.position[i])) if h else None for i, h in zip(at, hit)]


class FeatureCache:
    """The entries of one fingerprint: get and put float32 vectors of `dim` values by key. The packs' keys are
    read at the first lookup (packs written later, by this run or another, are not looked for in this run)."""

    def __init__(self, root: str, fingerprint: str, dim: int):
        self.folder = fs.join(root, fingerprint)
        self.dim = dim
        self._pool = ThreadPoolExecutor(IO_THREADS) if fs.is_remote(root) else None
        self._index: Optional[Index] = None
        self._lock = threading.Lock()

    def _map(self, fn, items):
        return list(self._pool.map(fn, items)) if self._pool else [fn(item) for item in items]

    def index(self) -> Index:
        with self._lock:
            if self._index is None:
                self._index = self._read_index()
            return self._index

    def _read_index(self) -> Index:
        folder = fs.join(self.folder, PACKS_DIR)
        packs = [
            (fs.join(folder, name), Pack.entries_in(size, self.dim))
            for name, size, _ in _objects(folder)
            if name.endswith(PACK_SUFFIX)
        ]
        keys = self._map(lambda pack: self._pack_keys(*pack), packs)
        counts = [len(k) // 32 for k in keys]
        if not any(counts):
            return Index(np.array([], "S32"), np.array([], np.int32), np.array([], np.int32), [])
        digests = np.frombuffer(b"".join(keys), dtype="S32")
        del keys  # the joined copy alone from here: the sort's peak is the arrays and their sorted copies
        pack = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        position = np.concatenate([np.arange(n, dtype=np.int32) for n in counts])
        order = np.argsort(digests, kind="stable")
        return Index(digests[order], pack[order], position[order], [(path, n) for (path, _), n in zip(packs, counts)])

    def _pack_keys(self, path: str, whole_entries: int) -> bytes:
        """A pack's keys (b"" when its header or keys are damaged: its entries are computed again)."""
        try:
            head = fs.read_range(path, 0, Pack.HEADER + 32 * whole_entries)
            if head[:4] != Pack.MAGIC:
                return b""
            dim, n, crc = struct.unpack("<III", head[4 : Pack.HEADER])
            if n != whole_entries:  # cut short: its keys may still be whole
                head = fs.read_range(path, 0, Pack.HEADER + 32 * n)
            keys = head[Pack.HEADER : Pack.HEADER + 32 * n]
            return keys if dim == self.dim and len(keys) == 32 * n and zlib.crc32(keys) == crc else b""
        except Exception:  # noqa: BLE001 - gone since listed, or unreadable: its entries are computed again
            return b""

    def get_many(self, keys: Sequence[str]) -> List[Optional[np.ndarray]]:
        """The cached vectors (None: missing, damaged or not finite: computed again)."""
        index = self.index()
        found: List[Optional[np.ndarray]] = [None] * len(keys)
        wanted: Dict[int, List[Tuple[int, int]]] = collections.defaultdict(list)  # pack -> (position, key's place)
        for place, where in enumerate(index.find([digest(k) for k in keys])):
            if where is not None:
                wanted[where[0]].append((where[1], place))
        size = Pack.entry_bytes(self.dim)

        def read(pack: int):
            path, n = index.packs[pack]
            got = []
            for run in _runs(sorted(wanted[pack]), size):
                first = Pack.offset(self.dim, n, run[0][0])
                try:
                    data = fs.read_range(path, first, Pack.offset(self.dim, n, run[-1][0]) + size - first)
                except Exception:  # noqa: BLE001 - removed (pruned) since the index was read
                    continue
                for position, place in run:
                    start = Pack.offset(self.dim, n, position) - first
                    got.append((place, Pack.vector(data[start : start + size], self.dim)))
            return got

        for got in self._map(read, sorted(wanted)):
            for place, vector in got:
                found[place] = vector
        return found

    def put_many(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        """Writes the entries as one pack."""
        if len(keys):
            write_whole(
                fs.join(self.folder, PACKS_DIR, f"{uuid.uuid4().hex}{PACK_SUFFIX}"),
                Pack.encode([digest(k) for k in keys], vectors),
            )

    def put(self, key: str, vector: np.ndarray) -> None:
        self.put_many([key], np.asarray(vector)[None])

    def close(self) -> None:
        """Ends the remote IO threads (a DoFn's teardown)."""
        if self._pool:
            self._pool.shutdown()


def _runs(positions: List[Tuple[int, int]], entry_bytes: int) -> List[List[Tuple[int, int]]]:
    """Sorted (position, place) pairs cut where the gap between two entries exceeds READ_GAP."""
    runs: List[List[Tuple[int, int]]] = []
    for item in positions:
        if runs and (item[0] - runs[-1][-1][0] - 1) * entry_bytes <= READ_GAP:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def _objects(folder: str) -> Iterator[Tuple[str, int, float]]:
    """(name under the folder, bytes, modified seconds) of every file under a folder, local or on an object store
    (one listing), as the listing goes; none when it does not exist."""
    if fs.is_remote(folder):
        for name, size, modified in _remote_files(folder):
            yield name, size, modified / 1e9
        return
    for path, _, names in os.walk(folder):
        for name in names:
            stat = os.stat(os.path.join(path, name))
            yield os.path.relpath(os.path.join(path, name), folder).replace(os.sep, "/"), stat.st_size, stat.st_mtime


def _remote_files(folder: str):
    try:
        return fs.remote_files(folder)
    except Exception as e:  # noqa: BLE001 - a prefix with no objects; any other failure (access, network) is raised
        if "No files found" in str(e):
            return []
        raise


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
        raise CacheError(
            f"the features cache cannot be written at {os.path.dirname(path)} ({e.strerror}): make the "
            "folder writable, or run with another --root (the cache is <root>/cache/features)"
        ) from None


def touch(root: str, fingerprint: str) -> None:
    """Marks the fingerprint as used now (prune() drops the least recently used first)."""
    write_whole(fs.join(root, fingerprint, LAST_USED), str(time.time()).encode())


def read_info(root: str, fingerprint: str) -> Dict:
    return json.loads(fs.read_bytes(fs.join(root, fingerprint, INFO_FILE)))


LEGACY_ENTRY_SUFFIX = ".f32"  # an entry a file (FORMAT_VERSION 2): counted and pruned, never read


def describe(root: str) -> List[Dict]:
    """Each fingerprint under a cache root (a local folder or gs://, one listing, streamed): its info, entries,
    bytes and when it was last used. Counted as the listing goes: no file names are kept (a cache written before
    packs has a file an image), only those of interrupted writes, which prune removes."""
    found: Dict[str, Dict] = {}

    def fingerprint_of(name: str) -> Dict:
        if name not in found:
            try:
                info = read_info(root, name)
            except Exception:  # noqa: BLE001 - missing or damaged (locally OSError/ValueError, remotely the store's)
                info = {}
            dim = info.get("dim") if isinstance(info.get("dim"), int) and info.get("dim") > 0 else 0
            found[name] = {"fingerprint": name, "entries": 0, "bytes": 0, "newest": None, "temporary": [], "size": dim}
            found[name].update({k: info.get(k) for k in ("model", "image_size", "dim", "weights")})
        return found[name]

    if not fs.is_remote(root) and os.path.isdir(root):  # an empty local folder is listed too (and pruned)
        for name in os.listdir(root):
            if os.path.isdir(os.path.join(root, name)) and name != SOURCES_DIR:
                fingerprint_of(name)
    for name, size, modified in _objects(root):
        if "/" not in name or name.split("/", 1)[0] == SOURCES_DIR:
            continue
        fingerprint, rest = name.split("/", 1)
        d = fingerprint_of(fingerprint)
        packed = d["size"] and rest.endswith(PACK_SUFFIX)
        d["entries"] += Pack.entries_in(size, d["size"]) if packed else rest.endswith(LEGACY_ENTRY_SUFFIX)
        d["bytes"] += size
        d["newest"] = modified if d["newest"] is None else max(d["newest"], modified)
        if ".tmp-" in rest:
            d["temporary"].append(rest)
    for d in found.values():
        newest = d.pop("newest")
        del d["size"]
        try:
            d["last_used"] = float(fs.read_bytes(fs.join(root, d["fingerprint"], LAST_USED)))
        except Exception:  # noqa: BLE001 - never touched: its newest file (an empty folder: the folder's time)
            d["last_used"] = newest if newest is not None else os.path.getmtime(os.path.join(root, d["fingerprint"]))
    return [found[name] for name in sorted(found)]


STALE_SECONDS = 3600  # a temporary file this old is left by an interrupted write, not one in progress


def prune(root: str, max_bytes: int) -> List[Dict]:
    """Removes the least recently used fingerprints of a cache root (a local folder or gs://) until it holds at
    most max_bytes (0: everything); returns what was removed. Temporary files of interrupted local writes go too.
    (A note in sources/ of a removed fingerprint is ignored by the next run, which makes the backbone again.)"""
    kept = sorted(describe(root), key=lambda d: d["last_used"], reverse=True)
    removed, total = [], sum(d["bytes"] for d in kept)
    while kept and total > max_bytes:
        oldest = kept.pop()
        _remove(root, oldest["fingerprint"])
        total -= oldest["bytes"]
        removed.append(oldest)
    if not kept:
        _remove(root, SOURCES_DIR)
    for d in kept:
        for name in d["temporary"]:
            path = fs.join(root, d["fingerprint"], name)
            if not fs.is_remote(root) and time.time() - os.path.getmtime(path) > STALE_SECONDS:
                os.remove(path)
    return removed


DELETE_CHUNK = 1000  # objects one remote delete names at most: a fingerprint's listing is never held whole


def _remove(root: str, folder: str) -> None:
    """A fingerprint's (or sources/) files: the local folder whole, or its objects, listed as they go."""
    if not fs.is_remote(root):
        shutil.rmtree(os.path.join(root, folder), ignore_errors=True)
        return
    # Beam (~4 s): the CLI imports this module at start-up (imagepipe cache); only removing remote files needs it
    from apache_beam.io.filesystems import FileSystems

    chunk = []
    for name, _, _ in _objects(fs.join(root, folder)):
        chunk.append(fs.join(root, folder, name))
        if len(chunk) == DELETE_CHUNK:
            FileSystems.delete(chunk)
            chunk = []
    if chunk:
        FileSystems.delete(chunk)
