"""ImageExampleGen's files near their class's split boundary (stratify.py: written to PENDING staging shards),
placed and rewritten as Beam stages of the ingestion's graph, so that Dataflow's workers share the work and no
process holds them all:

  the sure files' counts per stratum, the copies Resolve rejected, the pending files
      --CoGroupByKey(stratum)--> Assign (stratify.assign) --> (pending shard, (index, split))
      --GroupByKey(pending shard)--> Rewrite: the shard read once, each record written to a placed shard of its split

One element holds one stratum's pending files (its band: about Z standard deviations of where its boundary falls,
a few thousand files in a class of a million; a small class is pending whole) or one pending shard's placements.
The run's results get counts, notes, the placed shards and the splits of rejected pending copies; each pending
shard's moves are kept beside its placed shards (`moves_path`), read back a shard at a time for the few files a
near-duplicate decision names (`moved`).
"""

import collections
import json
import os
import uuid
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import CompressionTypes, FileSystems

from components.example_gen.splitting import stratify
from components.example_gen.writing import batch_ingest
from images import tfrecord_io
from storage import files as fs

# Under the staging folder: the shards the pending files are rewritten to, and their moves. Hidden: a split's folder
# is named after the split, and a hidden folder is never a split (listing.py skips them).
PLACED_DIR = ".placed"


def placed_dir(staging: str) -> str:
    return fs.join(staging, PLACED_DIR)


def moves_path(staging: str, pending_shard: str, attempt: str) -> str:
    """Where an attempt at a pending shard keeps its moves: [index, split, placed shard, index there] per record
    kept. Each attempt its own file: Dataflow may run a work item twice, and only the attempt whose outputs it
    keeps names its moves in the results ("moves")."""
    return fs.join(placed_dir(staging), "moves", f"{os.path.basename(pending_shard)}-{attempt}.json")


def stratum_items(
    results: beam.PCollection,
    rejected: beam.PCollection,
    pending: beam.PCollection,
    strata: Optional[stratify.LabelStrata],
) -> beam.PCollection:
    """(stratum, {"sure": [(split, n)], "rejected": [Meta], "pending": [Pending]}) for every stratum."""

    def sure_rows(kind_value):
        kind, value = kind_value
        if kind == "stratified":
            for stratum, split, n in value:
                yield stratum, (split, n)

    def rejected_rows(kind_value):
        kind, value = kind_value
        if kind != "rejected":
            return
        meta = value[0]
        if meta.split == stratify.PENDING:
            yield stratify.stratum(meta.label, strata), ("rejected", meta)
        elif not meta.preassigned:  # a sure hash-split copy removed: its split holds one file fewer
            yield stratify.stratum(meta.label, strata), ("sure", (meta.split, -1))

    rejections = rejected | "RejectedByStratum" >> beam.FlatMap(rejected_rows)
    return {
        "sure": (
            (results | "SureByStratum" >> beam.FlatMap(sure_rows)),
            (rejections | "SureRemoved" >> beam.FlatMap(lambda kv: [(kv[0], kv[1][1])] if kv[1][0] == "sure" else [])),
        )
        | "AllSure" >> beam.Flatten(),
        "rejected": rejections
        | "RejectedPending" >> beam.FlatMap(lambda kv: [(kv[0], kv[1][1])] if kv[1][0] == "rejected" else []),
        "pending": pending | "PendingByStratum" >> beam.Map(lambda p: (stratify.stratum(p.meta.label, strata), p)),
    } | "ByStratum" >> beam.CoGroupByKey()


class Assign(beam.DoFn):
    """Places one stratum's pending files by rank (stratify.assign) and moves their counts and size bins from
    PENDING to their splits. Main output: (pending shard, (index, split)) per file kept; on 'results':
    ("written", rows), ("sizes", rows), ("notes", text), ("rejected_split", [shard, index, split])."""

    def __init__(self, names: Sequence[str], shares: Sequence[float]):
        self._names, self._shares = list(names), list(shares)

    def process(self, element):
        stratum, grouped = element
        pending: List[batch_ingest.Pending] = list(grouped["pending"])
        if not pending:  # nothing to place (a single split never has any)
            return
        sure: Dict[str, int] = collections.Counter()
        for split, n in grouped["sure"]:
            sure[split] += n
        gone = {(m.shard, m.index) for m in grouped["rejected"]}
        waiting = [
            (p.meta.sha256, (p.meta.shard, p.meta.index)) for p in pending if (p.meta.shard, p.meta.index) not in gone
        ]
        placed, notes = stratify.assign(self._names, self._shares, {stratum: dict(sure)}, {stratum: waiting})
        for note in notes:  # in the order of their strata, as one assign over every stratum gave them
            yield beam.pvalue.TaggedOutput("results", ("notes", [stratum, note]))
        split_of_copy = {sha: placed[key] for sha, key in waiting}
        written, sizes = collections.Counter(), collections.Counter()
        for meta, width, height in pending:
            key = (meta.shard, meta.index)
            if key in gone:  # a rejected copy goes where its copies went, or the first split (its row says so)
                split = split_of_copy.get(meta.sha256, self._names[0])
                yield beam.pvalue.TaggedOutput("results", ("rejected_split", [meta.shard, meta.index, split]))
            else:
                split = placed[key]
                yield meta.shard, (meta.index, split)
            kind = (meta.label, meta.format, meta.downscaled)
            written[(stratify.PENDING, *kind)] -= 1
            written[(split, *kind)] += 1
            for side, value in (("width", width), ("height", height)):
                sizes[(stratify.PENDING, side, batch_ingest.size_bucket(value))] -= 1
                sizes[(split, side, batch_ingest.size_bucket(value))] += 1
        yield beam.pvalue.TaggedOutput("results", ("written", [[*k, n] for k, n in written.items()]))
        yield beam.pvalue.TaggedOutput("results", ("sizes", [[*k, n] for k, n in sizes.items()]))


class Rewrite(beam.DoFn):
    """Reads one pending shard once and writes each record it keeps to its split's placed shard (a new one past
    shard_bytes: batch_ingest.ShardWriter), in the shard's order; keeps the moves (`moves_path`). Outputs ("shard",
    Shard) per placed shard and ("moves", [pending shard, moves file]). A retried element writes new files (a random
    part in each name); only the shards and moves of the attempt Beam keeps are finalized and read."""

    def __init__(self, staging: str, level: int, shard_bytes: int):
        self._staging, self._level, self._shard_bytes = staging, level, shard_bytes

    def process(self, element: Tuple[str, Iterable[Tuple[int, str]]]):
        shard, placements = element
        split_of = dict(placements)
        # Placed shards named after the pending shard, so they keep its place in each split's order.
        batch_key = os.path.basename(shard)[: -len(".gz")]
        writers: Dict[str, batch_ingest.ShardWriter] = {}
        moves = []
        with FileSystems.open(shard, compression_type=CompressionTypes.UNCOMPRESSED) as src:
            for index, record in enumerate(tfrecord_io.read_gzip_tfrecords(src)):
                split = split_of.get(index)
                if split is None:  # a copy Resolve rejected
                    continue
                if split not in writers:
                    writers[split] = batch_ingest.ShardWriter(
                        placed_dir(self._staging), split, self._level, self._shard_bytes, batch_key
                    )
                moves.append([index, split, *writers[split].write(record)])
        kept = moves_path(self._staging, shard, uuid.uuid4().hex[:8])
        fs.write_bytes(kept, json.dumps(moves).encode("ascii"))
        for writer in writers.values():
            writer.close()
            for placed_shard in writer.closed:
                yield "shard", list(placed_shard)
        yield "moves", [shard, kept]


def moved(
    metas: Iterable[batch_ingest.Meta], moves_of: Dict[str, str], rejected_split: Dict[Tuple[str, int], str]
) -> Dict[Tuple[str, int], batch_ingest.Meta]:
    """The pending files among `metas`, as placed: {(pending shard, index): the meta with its split, and the placed
    shard and index that now hold it}; a rejected copy keeps its pending shard (it was not written). `moves_of`:
    each rewritten pending shard's moves file (Rewrite's "moves"), read one at a time."""
    by_shard: Dict[str, List[batch_ingest.Meta]] = collections.defaultdict(list)
    for meta in metas:
        if meta.split == stratify.PENDING:
            by_shard[meta.shard].append(meta)
    found = {}
    for shard, wanted in by_shard.items():
        kept = [m for m in wanted if (m.shard, m.index) not in rejected_split]
        for m in wanted:
            if (m.shard, m.index) in rejected_split:
                found[(m.shard, m.index)] = m._replace(split=rejected_split[(m.shard, m.index)])
        if not kept:
            continue
        moves = {index: (split, path, at) for index, split, path, at in json.loads(fs.read_bytes(moves_of[shard]))}
        for m in kept:
            split, path, at = moves[m.index]
            found[(m.shard, m.index)] = m._replace(split=split, shard=path, index=at)
    return found
