"""The Beam transforms of ImageExampleGen (the graph itself is in executor.py).

InspectAndWrite hands batches of files to batch_ingest. On Dataflow (or Beam's
multi_processing mode) Beam already runs one worker process per core, so a batch
is ingested inline. With the local in-memory DirectRunner, the default for TFX,
everything would run on one core: there the DoFn keeps a pool of spawned worker
processes (worker_pool.py). Threads do not help (the GIL serialises Pillow's
Python side), and Beam's multi_processing workers start slowly (each imports
Beam and TensorFlow); these workers import only Pillow and batch_ingest
(docs/benchmarks.md: Benchmarks, Ingestion).
"""

import collections
import concurrent.futures
import json
from typing import Iterable, List, Tuple

import apache_beam as beam
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

from components.example_gen.writing import worker_pool
from components.example_gen.writing.batch_ingest import BatchResult, Meta, Settings, ingest_batch_file
from images.finding.listing import split_sort_key
from images.image_check import Reason, bad_row
from storage import files as fs
from storage.progress_events import progress_event


class InspectAndWrite(beam.DoFn):
    """Ingests the batch file it is given; see batch_ingest.ingest_batch.

    Outputs a Meta per written example (main, for duplicate detection), a Pending per file written to a PENDING
    shard (on 'pending'), and, on the 'results' tag, ("bad", quarantine row), ("shard", Shard) for every
    staging shard it wrote and ("written", counts per (split, label, format, downscaled)).
    """

    def __init__(self, settings: Settings, processes: int, total_files: int = 0):
        self._settings = settings
        self._processes = processes
        self._total = total_files

    def setup(self):
        self._pool = worker_pool.WorkerPool(self._processes) if self._processes > 1 else None
        self._done = 0  # files processed by this instance, across its bundles

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(cancel=True)  # all work is done, or has failed
            self._pool = None

    def start_bundle(self):
        self._pending: List[concurrent.futures.Future] = []

    def process(self, batch_file: str):
        if self._pool is None:
            yield from self._outputs(ingest_batch_file(batch_file, self._settings))
            return
        self._pending.append(self._pool.submit(ingest_batch_file, batch_file, self._settings))
        # Emit finished batches as they come, and keep at most two batches per process in flight.
        while self._pending and (self._pending[0].done() or len(self._pending) > 2 * self._processes):
            try:
                result = self._pending.pop(0).result()
            except Exception:
                self.teardown()
                raise
            yield from self._outputs(result)

    def finish_bundle(self):
        try:
            results = [future.result() for future in self._pending]
        except Exception:
            # Stop the other batches now: nothing more may be written into the failing output.
            self.teardown()
            raise
        self._pending = []
        for result in results:
            for output in self._outputs(result):
                if isinstance(output, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(output.tag, _in_global_window(output.value))
                else:
                    yield _in_global_window(output)

    def _outputs(self, result: BatchResult):
        self._done += len(result.metas) + len(result.bad)
        progress_event("ingest", self._done, self._total)  # live progress for `imagepipe run`
        for row in result.bad:
            yield beam.pvalue.TaggedOutput("results", ("bad", row))
        for shard in result.shards:
            yield beam.pvalue.TaggedOutput("results", ("shard", shard))
        yield beam.pvalue.TaggedOutput("results", ("written", [[*k, n] for k, n in result.written.items()]))
        yield beam.pvalue.TaggedOutput("results", ("sizes", [[*k, n] for k, n in result.sizes.items()]))
        yield beam.pvalue.TaggedOutput("results", ("stratified", [[*k, n] for k, n in result.stratified.items()]))
        for pending in result.pending:  # placed by rank once every file is read (placement.py)
            yield beam.pvalue.TaggedOutput("pending", pending)
        for path in result.signature_files:  # the near-duplicate search in the executor reads them
            yield beam.pvalue.TaggedOutput("results", ("signatures", path))
        for reviewed in result.reviewed:
            yield beam.pvalue.TaggedOutput("results", ("reviewed", list(reviewed)))
        yield from result.metas


def _in_global_window(value) -> WindowedValue:
    return WindowedValue(value, window.MIN_TIMESTAMP, [window.GlobalWindow()])


def key_by_hash(m: Meta) -> Tuple[str, Meta]:
    return m.sha256, m


CONFLICTS_SHOWN = 3  # other copies a label-conflict row names (then "and N more")


class Resolve(beam.DoFn):
    """For one content hash seen more than once, decides which written copies must go.

    Emits ("rejected", (Meta, quarantine row)) for each copy to remove from the
    staging shards, and ("duplicates", [paths]) for the group.
    """

    def __init__(self, drop_duplicates: bool):
        self._drop_duplicates = drop_duplicates

    def process(self, element: Tuple[str, Iterable[Meta]]):
        _, group = element
        metas = sorted(group, key=lambda m: m.rel_path)
        if len(metas) < 2:
            return
        yield "duplicates", [m.rel_path for m in metas]
        if len({m.label for m in metas}) > 1:
            # The same bytes under two labels: no way to know which one is right. Each row names a few of the
            # others (a manifest naming one file 5,000 times made rows of 5,000 paths each: quadratic).
            for m in metas:
                others = [o for o in metas[: CONFLICTS_SHOWN + 1] if o is not m][:CONFLICTS_SHOWN]
                more = len(metas) - 1 - len(others)
                named = ", ".join(f"{o.rel_path} ({o.label})" for o in others) + (f" and {more:,} more" if more else "")
                yield (
                    "rejected",
                    (m, bad_row(m.rel_path, Reason.LABEL_CONFLICT, f"same content as {named}", m.label, m.split)),
                )
            return
        # Keep copies in one split only: the first pre-assigned split, else the hash split.
        preassigned = sorted({m.split for m in metas if m.preassigned}, key=split_sort_key)
        keep_split = preassigned[0] if preassigned else metas[0].split
        anchor = next(o for o in metas if o.split == keep_split)
        kept: List[Meta] = []
        for m in metas:
            if m.split != keep_split:
                yield (
                    "rejected",
                    (
                        m,
                        bad_row(
                            m.rel_path,
                            Reason.DUPLICATE_ACROSS_SPLITS,
                            f"same content as {anchor.rel_path} in split {keep_split!r}; kept there only",
                            m.label,
                            m.split,
                        ),
                    ),
                )
            elif self._drop_duplicates and kept:
                yield (
                    "rejected",
                    (m, bad_row(m.rel_path, Reason.DUPLICATE, f"same content as {kept[0].rel_path}", m.label, m.split)),
                )
            else:
                kept.append(m)


class CollectResults(beam.CombineFn):
    """Gathers the small results of the run into one dict (lists, and counts of written examples)."""

    KINDS = (
        "bad",
        "shard",
        "rejected",
        "duplicates",
        "near_pairs",
        "signatures",
        "reviewed",
        "notes",
        "rejected_split",
        "moves",
    )
    COUNTS = ("written", "sizes", "stratified")  # [*key, n] rows, summed by key

    def create_accumulator(self):
        return {**{kind: [] for kind in self.KINDS}, **{kind: collections.Counter() for kind in self.COUNTS}}

    def add_input(self, acc, kind_value):
        kind, value = kind_value
        if kind in self.COUNTS:
            for *key, n in value:
                acc[kind][tuple(key)] += n
        else:
            acc[kind].append(value)
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            for kind in self.KINDS:
                out[kind] += acc[kind]
            for kind in self.COUNTS:
                out[kind].update(acc[kind])
        return out

    def extract_output(self, acc):
        return {
            **{kind: acc[kind] for kind in self.KINDS},
            **{kind: [[*key, n] for key, n in sorted(acc[kind].items())] for kind in self.COUNTS},
        }


def save_json(value, path: str) -> None:
    """Writes a small result where the executor can read it after the run (any file system)."""
    fs.write_bytes(path, json.dumps(value, sort_keys=True).encode("ascii"))
