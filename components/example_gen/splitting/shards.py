"""After ImageExampleGen's Beam pass (the pending files already placed: placement.py), the shards finalized: renamed
to Split-<split>/data_tfrecord-NNNNN-of-NNNNN.gz; the rare shard that holds a rejected copy (the same bytes under two
labels or in two splits, a near duplicate dropped) is rewritten without it."""

import collections
import os
from typing import Dict, List, Set, Tuple

from apache_beam.io.filesystems import CompressionTypes, FileSystems

from components.example_gen.writing import batch_ingest
from images import tfrecord_io
from storage import files as fs


def finalize_shards(
    shards: List[batch_ingest.Shard],
    rejected: List[Tuple[batch_ingest.Meta, dict]],
    examples_uri: str,
    split_names: List[str],
    level: int,
    placed_dir: str,
) -> None:
    """Moves staging shards to Split-<name>/data_tfrecord-NNNNN-of-NNNNN.gz: a split's own shards, then those its
    pending files were placed in (under placed_dir), each in the order of their names. A shard that holds a
    rejected copy is rewritten without it (rare: the same bytes under two labels or in two splits, or a near
    duplicate dropped). PENDING shards were rewritten already (placement.py) and stay behind."""
    drop: Dict[str, Set[int]] = collections.defaultdict(set)
    for meta, _ in rejected:
        drop[meta.shard].add(meta.index)
    moves: List[Tuple[str, str]] = []  # renamed in one call: an object store copies them in batches
    for split in split_names:
        mine = sorted(
            (s for s in shards if s.split == split), key=lambda s: (s.path.startswith(placed_dir + "/"), s.path)
        )
        keep = [s for s in mine if s.records > len(drop.get(s.path, ()))]
        split_dir = fs.join(examples_uri, f"Split-{split}")
        if not fs.is_remote(split_dir):
            os.makedirs(split_dir, exist_ok=True)  # object stores have no folders to make
        for i, shard in enumerate(keep):
            dest = fs.join(split_dir, f"data_tfrecord-{i:05d}-of-{len(keep):05d}.gz")
            if shard.path not in drop:
                moves.append((shard.path, dest))
                continue
            _copy_records(shard.path, dest, level, lambda index, path=shard.path: index not in drop[path])
    if moves:
        FileSystems.rename([source for source, _ in moves], [dest for _, dest in moves])


def _copy_records(source: str, dest: str, level: int, keep) -> None:
    """The records of one shard whose index `keep` accepts, into a new shard."""
    with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as src:
        writer = tfrecord_io.GzipTFRecordWriter(
            FileSystems.create(dest, compression_type=CompressionTypes.UNCOMPRESSED), level
        )
        for index, record in enumerate(tfrecord_io.read_gzip_tfrecords(src)):
            if keep(index):
                writer.write(record)
        writer.close()
