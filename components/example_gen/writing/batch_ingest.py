"""Ingests one batch of files: read, validate, hash, encode, append to staging shards.

This is the per-file work of ImageExampleGen. It runs inside the Beam DoFn, or
in the DoFn's worker processes when ingesting locally (see beam_steps.py), so it
imports neither Beam nor TensorFlow, so a fresh worker process starts at once.

Each file is read once. Only small metadata (Meta) leaves this module, so the
memory of a run does not grow with the bytes of the corpus.
"""

import collections
import hashlib
import json
import uuid
from typing import Dict, List, NamedTuple, Optional, Tuple

from threadpoolctl import threadpool_limits

from components.example_gen.ingest_defaults import Ingestion
from components.example_gen.splitting import stratify
from images import example_codec, tfrecord_io
from images import feature_keys as keys
from images.finding.listing import Candidate, labels_of
from images.image_check import BadImage, ImageInfo, Reason, bad_row, check_and_store, check_file_size
from images.near_duplicates import grouping, similarity
from storage import files as fs


class Settings(NamedTuple):
    """What a worker needs to ingest a batch: the declared ingestion settings, whole (a new one reaches the
    per-file code with no copy), and what the run found; picklable and small."""

    declared: Ingestion  # max_pixels, store_max_pixels, compression_level, shard_megabytes, ...
    staging_dir: str
    label_ids: Dict[str, int]
    hash_splits: List[str]
    # Per class, the positions whose split is only known once every file is read (stratify.py): such files
    # are written to stratify.PENDING staging shards.
    bands: Dict[str, Tuple[float, float]] = {}
    strata: Optional[stratify.LabelStrata] = None  # multi-label: how label sets are stratified (None: by class)
    # The near-duplicate search runs in the executor's memory (grouping.search_files): each batch writes
    # its signatures to a file of its own, and its Metas leave without them (lighter through Beam's shuffle).
    signatures_in_files: bool = False
    sign: bool = True  # perceptual signatures for the near-duplicate search (False: --near-duplicates off)
    multi_label: bool = False  # candidates' labels are label sets (label_set): written as keys.LABELS
    # --review: content hash -> (action, new label, the review file) of each decision that changes something
    # (storage/review_file.py): applied to the file with those exact bytes, before its split is chosen.
    review: Dict[str, Tuple[str, str, str]] = {}


class Meta(NamedTuple):
    """A written example, without its bytes: enough to find duplicates and count."""

    sha256: str
    rel_path: str
    label: str
    split: str
    preassigned: bool  # split came from the layout, not from the hash
    format: str
    shard: str  # staging shard that holds the record
    index: int  # position of the record in that shard
    downscaled: bool = False  # stored as a copy within store_max_pixels
    signature: str = ""  # hex of the perceptual signature (similarity.py); "" when none could be made


class Pending(NamedTuple):
    """A file written to a PENDING shard (stratify.py): its Meta, and what placing it (placement.py) needs. Only
    these files carry it: more fields on every Meta cost the executor ~30 kB a file in Beam (measured:
    8,000 files, peak 1,035 -> 1,327 MB)."""

    meta: Meta
    width: int  # of the file as found: its size bins are counted once its split is known
    height: int


class Shard(NamedTuple):
    split: str
    path: str
    records: int


class BatchResult(NamedTuple):
    metas: List[Meta]
    bad: List[Dict[str, str]]  # quarantine rows
    shards: List[Shard]
    written: Dict[Tuple[str, str, str, bool], int]  # examples per (split, label, format, downscaled)
    sizes: Dict[Tuple[str, str, str], int]  # examples per (split, "width" or "height", size_bucket(original))
    stratified: Dict[Tuple[str, str], int]  # hash-split examples written straight to a split, per (label, split)
    pending: List[Pending]  # the files written to PENDING shards
    signature_files: List[str]  # with Settings.signatures_in_files: the batch's file of signatures
    reviewed: List[Tuple[str, str]]  # (content hash, action) of each review decision applied


def size_bucket(side: int) -> str:
    """Power-of-two bins of an image side, for the data profile: "<=32", "<=64", ... "<=4096", ">4096"."""
    bound = 32
    while side > bound and bound < 4096:
        bound *= 2
    return f"<={bound}" if side <= bound else ">4096"


def label_features(label: str, settings: Settings) -> Dict[str, object]:
    """The example's label features: the class, or a multi-label image's labels (none: empty lists)."""
    if settings.multi_label:
        names = labels_of(label)
        return {keys.LABELS: [settings.label_ids[n] for n in names], keys.LABELS_TEXT: example_codec.BytesValues(names)}
    return {keys.LABEL: settings.label_ids[label], keys.LABEL_TEXT: label}


class ShardWriter:
    """Appends records to staging shards of one split, starting a new shard past max_bytes."""

    def __init__(self, staging_dir: str, split: str, level: int, max_bytes: int, batch_key: str):
        self._dir, self._split, self._level, self._max_bytes = staging_dir, split, level, max_bytes
        self._batch_key = batch_key
        self._stream = None
        self.closed: List[Shard] = []

    def write(self, record: bytes) -> Tuple[str, int]:
        """Returns (shard path, index of the record in that shard)."""
        if self._stream is not None and self._bytes >= self._max_bytes:
            self.close()
        if self._stream is None:
            # Final shards are numbered in the order of these names: the batch and the shard's place in
            # it make that order (so the examples' order, and training) the same on every run; the
            # random part keeps a retried batch from writing over a first attempt still running.
            name = f"{self._batch_key}-{len(self.closed):05d}-{uuid.uuid4().hex[:8]}.gz"
            self._path = fs.join(self._dir, self._split, name)
            self._stream = tfrecord_io.GzipTFRecordWriter(fs.open_for_write(self._path), self._level)
            self._records = self._bytes = 0
        self._stream.write(record)
        self._records += 1
        self._bytes += len(record)
        return self._path, self._records - 1

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            self.closed.append(Shard(self._split, self._path, self._records))


class Inspected(NamedTuple):
    """One file, read and validated: a quarantine row, or its bytes and what to store."""

    bad: Optional[Dict[str, str]] = None
    data: bytes = b""  # the file's bytes
    info: Optional[ImageInfo] = None
    stored: bytes = b""  # data, or a downscaled copy above store_max_pixels (image_check.check_and_store)
    stored_info: Optional[ImageInfo] = None


def inspect(c: Candidate, settings: Settings) -> Inspected:
    """Reads and validates one file."""
    max_pixels = settings.declared.max_pixels

    def bad(reason: str, detail: str) -> Inspected:
        return Inspected(bad_row(c.rel_path, reason, detail, c.label, c.split))

    if c.problem:
        return bad(*c.problem)
    try:
        check_file_size(c.size, max_pixels)
    except BadImage as e:
        return bad(e.reason, e.detail)
    try:
        data = fs.read_bytes(c.uri)
    except FileNotFoundError:
        return bad(Reason.MISSING_FILE, "file does not exist")
    except Exception as e:  # noqa: BLE001 - remote file systems raise their own types (e.g. NotFound)
        if type(e).__name__ == "NotFound":
            return bad(Reason.MISSING_FILE, "object does not exist")
        return bad(Reason.UNREADABLE, f"cannot read: {e}")
    try:
        info, stored, stored_info = check_and_store(data, max_pixels, settings.declared.store_max_pixels, settings.sign)
    except BadImage as e:
        return bad(e.reason, e.detail)
    return Inspected(None, data, info, stored, stored_info)


# BLAS threads an ingestion process runs numpy's matrix products on (the signatures': images/near_duplicates/
# signature.py). Each process already has its core (a worker per core here, Beam's per core elsewhere), and
# OpenBLAS's default of a thread per core made two workers on two cores run four spinning threads.
BLAS_THREADS = 1


def ingest_batch(candidates: List[Candidate], settings: Settings) -> BatchResult:
    """Validates every candidate and writes the good ones, as tf.Examples, to staging shards."""
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):  # ~1.5 ms a batch; the limit is undone after
        return _ingest_batch(candidates, settings)


def _ingest_batch(candidates: List[Candidate], settings: Settings) -> BatchResult:
    writers: Dict[str, ShardWriter] = {}
    result = BatchResult([], [], [], collections.Counter(), collections.Counter(), collections.Counter(), [], [], [])
    batch_key = (
        hashlib.sha256(candidates[0].rel_path.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        if candidates
        else "empty"
    )
    # In phases, each a loop of its own: a function call per file would cost on this hot path.
    written = _write_examples(candidates, settings, writers, batch_key, result)
    _account_examples(written, result)
    for writer in writers.values():
        writer.close()
        result.shards.extend(writer.closed)
    if settings.signatures_in_files:
        signed = [m for m in result.metas if m.signature]
        if signed:
            result.signature_files.append(grouping.write_signatures(signed, settings.staging_dir, batch_key))
        result.metas[:] = [m._replace(signature="") for m in result.metas]
    return result


def _write_examples(
    candidates: List[Candidate], settings: Settings, writers: Dict[str, ShardWriter], batch_key: str, result
) -> list:
    """Ingestion's first phase: each file read, validated, reviewed, given its split and written by the split's
    writer; quarantine rows and review decisions go into `result`. Returns each example written as
    (candidate, sha256, split, stratum, info, shard, index, downscaled)."""
    written = []
    for c in candidates:
        bad, data, info, stored, stored_info = inspect(c, settings)
        if bad:
            result.bad.append(bad)
            continue
        sha = hashlib.sha256(data).hexdigest()  # of the original: splits and duplicates follow the file
        decided = settings.review.get(sha)
        if decided:
            action, new_label, review_file = decided
            result.reviewed.append((sha, action if action == "exclude" or new_label != c.label else "unchanged"))
            if action == "exclude":
                result.bad.append(
                    bad_row(c.rel_path, Reason.EXCLUDED_BY_REVIEW, f"excluded by {review_file}", c.label, c.split)
                )
                continue
            c = c._replace(label=new_label)
        # The layout's split, or the class's stratified split by content hash (stratify.py: or PENDING when the
        # file's place in its class decides it): identical bytes always land in the same split.
        stratum = stratify.stratum(c.label, settings.strata)
        split = c.split or stratify.zone(sha, settings.hash_splits, settings.bands.get(stratum))
        record = example_codec.encode_example(
            {
                keys.ENCODED: stored,  # the original bytes, or the downscaled copy above store_max_pixels
                keys.FORMAT: stored_info.format,
                keys.HEIGHT: stored_info.height,
                keys.WIDTH: stored_info.width,
                keys.CHANNELS: stored_info.channels,
                keys.ORIGINAL_HEIGHT: info.height,
                keys.ORIGINAL_WIDTH: info.width,
                **label_features(c.label, settings),
                keys.FILENAME: c.rel_path,
                keys.SHA256: sha,
                keys.SIGNATURE: similarity.hashes_only(info.signature).hex() if info.signature else "",
            }
        )
        if split not in writers:
            writers[split] = ShardWriter(
                settings.staging_dir,
                split,
                settings.declared.compression_level,
                settings.declared.shard_megabytes << 20,
                batch_key,
            )
        shard, index = writers[split].write(record)
        written.append((c, sha, split, stratum, info, shard, index, stored is not data))
    return written


def _account_examples(written: list, result: BatchResult) -> None:
    """Ingestion's second phase: each written example's Meta (and Pending, in a PENDING shard) and its counts."""
    for c, sha, split, stratum, info, shard, index, downscaled in written:
        result.metas.append(
            Meta(
                sha,
                c.rel_path,
                c.label,
                split,
                c.split is not None,
                info.format,
                shard,
                index,
                downscaled,
                info.signature.hex(),
            )
        )
        if split == stratify.PENDING:
            result.pending.append(Pending(result.metas[-1], info.width, info.height))
        result.written[(split, c.label, info.format, downscaled)] += 1
        if not c.split and split != stratify.PENDING:
            result.stratified[(stratum, split)] += 1
        result.sizes[(split, "width", size_bucket(info.width))] += 1
        result.sizes[(split, "height", size_bucket(info.height))] += 1


def ingest_batch_file(batch_file: str, settings: Settings) -> BatchResult:
    return ingest_batch(read_candidates(batch_file), settings)


def write_candidates(candidates: List[Candidate], path: str) -> None:
    # ASCII escapes keep file names with undecodable bytes (surrogates) intact.
    fs.write_bytes(path, json.dumps([list(c) for c in candidates]).encode("ascii"))


def read_candidates(path: str) -> List[Candidate]:
    rows = json.loads(fs.read_bytes(path).decode("ascii"))
    return [Candidate(*row[:6], problem=tuple(row[6]) if row[6] else None) for row in rows]
