"""After ImageExampleGen's Beam pass: the files near their class's split boundary (stratify.py: written to PENDING
shards) placed by rank, and the shards finalized: renamed to Split-<split>/data_tfrecord-NNNNN-of-NNNNN.gz; a pending
shard, and the rare shard that holds a copy Resolve rejected (same bytes under two labels, across two splits), is
rewritten."""

import collections
import os
from typing import Dict, List, Optional, Set, Tuple

from absl import logging
from apache_beam.io.filesystems import CompressionTypes, FileSystems

from components.example_gen import batch_ingest, stratify, tfrecord_io
from storage import files as fs

PlacedKey = Tuple[str, int]  # (staging shard, index): a pending file's record


def place_pending(pending: List[batch_ingest.Pending], stratified: List[list],
                  rejected: List[Tuple[batch_ingest.Meta, dict]], counts: collections.Counter,
                  sizes: collections.Counter, names: List[str], shares: List[float],
                  strata: Optional[stratify.LabelStrata] = None) -> Tuple[Dict[PlacedKey, str], List[str]]:
    """Places the files written to PENDING shards by their rank in their stratum (stratify.assign: their class, or
    a multi-label file's stratify.stratum), and moves their counts and size bins to their splits. `stratified`:
    [stratum, split, n] of the hash-split files the workers wrote straight to a split. Returns
    ({(shard, index): split}, notes)."""
    if not pending:
        return {}, []
    gone = {(m.shard, m.index) for m, _ in rejected}
    sure: Dict[str, Dict[str, int]] = collections.defaultdict(dict)
    for label, split, n in stratified:
        sure[label][split] = sure[label].get(split, 0) + n
    for meta, _ in rejected:
        if meta.split != stratify.PENDING and not meta.preassigned:
            sure[stratify.stratum(meta.label, strata)][meta.split] -= 1
    waiting: Dict[str, List[Tuple[str, PlacedKey]]] = collections.defaultdict(list)
    for meta, *_ in pending:
        if (meta.shard, meta.index) not in gone:
            waiting[stratify.stratum(meta.label, strata)].append((meta.sha256, (meta.shard, meta.index)))
    placed, notes = stratify.assign(names, shares, sure, waiting)
    split_of_copy = {(label, sha): placed[key] for label, items in waiting.items() for sha, key in items}
    for meta, width, height, _ in pending:  # a rejected pending file goes where its copies went, or the first split
        split = placed.setdefault((meta.shard, meta.index), split_of_copy.get(
            (stratify.stratum(meta.label, strata), meta.sha256), names[0]))
        kind = (meta.label, meta.format, meta.downscaled)
        counts[(stratify.PENDING, *kind)] -= 1
        counts[(split, *kind)] += 1
        for side, value in (("width", width), ("height", height)):
            sizes[(stratify.PENDING, side, batch_ingest.size_bucket(value))] -= 1
            sizes[(split, side, batch_ingest.size_bucket(value))] += 1
    for note in notes:
        logging.warning("ImageExampleGen: %s", note)
    return placed, notes


def placed_meta(meta: batch_ingest.Meta, placed: Dict[PlacedKey, str]) -> batch_ingest.Meta:
    """The meta with its final split (a pending file's, once placed)."""
    return meta._replace(split=placed[(meta.shard, meta.index)]) if meta.split == stratify.PENDING else meta


def finalize_shards(shards: List[batch_ingest.Shard], rejected: List[Tuple[batch_ingest.Meta, dict]],
                    examples_uri: str, split_names: List[str], level: int,
                    placed: Optional[Dict[PlacedKey, Tuple[str, int]]] = None, shard_bytes: int = 64 << 20) -> None:
    """Moves staging shards to Split-<name>/data_tfrecord-NNNNN-of-NNNNN.gz.

    A shard that holds a rejected copy is rewritten without it (rare: it takes
    the same bytes under two labels or in two splits). PENDING shards are read
    once, each record written to its split (`placed`: split and record size),
    into new shards that rotate at shard_bytes, after the split's own.
    """
    drop: Dict[str, Set[int]] = collections.defaultdict(set)
    for meta, _ in rejected:
        drop[meta.shard].add(meta.index)
    pending = sorted((s for s in shards if s.split == stratify.PENDING), key=lambda s: s.path)
    # Where each kept pending record goes: (split, its new shard's number among the split's new shards).
    routes: Dict[PlacedKey, Tuple[str, int]] = {}
    filled: Dict[str, List[int]] = {}  # per split, the bytes of each new shard
    for shard in pending:
        for index in range(shard.records):
            if index in drop.get(shard.path, ()):
                continue
            split, size = placed[(shard.path, index)]
            sizes = filled.setdefault(split, [0])
            if sizes[-1] and sizes[-1] + size > shard_bytes:
                sizes.append(0)
            sizes[-1] += size
            routes[(shard.path, index)] = (split, len(sizes) - 1)
    writers: Dict[Tuple[str, int], tfrecord_io.GzipTFRecordWriter] = {}
    for split in split_names:
        mine = sorted((s for s in shards if s.split == split), key=lambda s: s.path)
        keep = [s for s in mine if s.records > len(drop.get(s.path, ()))]
        total = len(keep) + len(filled.get(split, []))
        split_dir = fs.join(examples_uri, f"Split-{split}")
        if not fs.is_remote(split_dir):
            os.makedirs(split_dir, exist_ok=True)  # object stores have no folders to make
        for i, shard in enumerate(keep):
            dest = fs.join(split_dir, f"data_tfrecord-{i:05d}-of-{total:05d}.gz")
            if shard.path not in drop:
                FileSystems.rename([shard.path], [dest])
                continue
            _copy_records(shard.path, dest, level, lambda index, path=shard.path: index not in drop[path])
        for n in range(len(filled.get(split, []))):
            writers[(split, n)] = tfrecord_io.GzipTFRecordWriter(FileSystems.create(
                fs.join(split_dir, f"data_tfrecord-{len(keep) + n:05d}-of-{total:05d}.gz"),
                compression_type=CompressionTypes.UNCOMPRESSED), level)
    for shard in pending:  # one pass over them
        with FileSystems.open(shard.path, compression_type=CompressionTypes.UNCOMPRESSED) as src:
            for index, record in enumerate(tfrecord_io.read_gzip_tfrecords(src)):
                if (shard.path, index) in routes:
                    writers[routes[(shard.path, index)]].write(record)
    for writer in writers.values():
        writer.close()


def _copy_records(source: str, dest: str, level: int, keep) -> None:
    """The records of one shard whose index `keep` accepts, into a new shard."""
    with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as src:
        writer = tfrecord_io.GzipTFRecordWriter(
            FileSystems.create(dest, compression_type=CompressionTypes.UNCOMPRESSED), level)
        for index, record in enumerate(tfrecord_io.read_gzip_tfrecords(src)):
            if keep(index):
                writer.write(record)
        writer.close()
