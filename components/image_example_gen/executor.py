"""Beam executor of ImageExampleGen: image files -> validated, split, sharded tf.Examples.

The Beam graph, per run:

  candidate batch files --InspectAndWrite--> staging shards (gzip TFRecords, one pass over the bytes)
                               |--> Meta per example --GroupByKey(sha256)--> Resolve --> copies to remove
                               |--> quarantine rows, closed shards, counts --> results.json

Then, outside Beam, the shards are finalized: renamed to
Split-<split>/data_tfrecord-NNNNN-of-NNNNN.gz, and the rare shard that holds a
copy Resolve rejected (same bytes under two labels, across two splits) is
rewritten without it. Only metadata goes through the GroupByKey, so memory does
not grow with the bytes of the corpus, and each file is read once.
"""

import collections
import hashlib
import json
import os
import time
from typing import Any, Dict, List, Set, Tuple

import apache_beam as beam
from absl import logging
from apache_beam.io.filesystems import CompressionTypes, FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
)
from tfx import types
from tfx.components.util import examples_utils
from tfx.dsl.components.base import base_beam_executor
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils

from components import drift
from components.beam_pickler import quiet_pickler_trace
from components.image_example_gen import (LABEL_MAP_FILE, NEAR_DUPLICATES_FILE, PROFILE_FILE, QUARANTINE_FILE,
                                          SUMMARY_FILE, batch_ingest, beam_steps, near_duplicates, similarity, sources,
                                          tfrecord_io)
from components.image_example_gen.ingest_report import (NEAR_DUPLICATE_COLUMNS, build_summary, check_summary,
                                                        log_summary, quarantine_csv)
from components.image_example_gen.ingest_settings import REPORT_KEY, IngestSettings
from components.spreadsheet import csv_text
from storage import files as fs

def _write_json(value: Any, path: str) -> None:
    io_utils.write_string_file(path, json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False))


def _read_json(path: str) -> Any:
    return json.loads(io_utils.read_string_file(path))


class Executor(base_beam_executor.BaseBeamExecutor):
    """Ingests image files into tf.Examples; see the module docstring for the graph."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        examples = artifact_utils.get_single_instance(output_dict[standard_component_specs.EXAMPLES_KEY])
        report = artifact_utils.get_single_instance(output_dict[REPORT_KEY])
        settings = IngestSettings.from_exec_properties(exec_properties)

        listing = settings.list_inputs()
        sources.check_usable(listing)
        hash_splits, buckets = settings.output_splits()
        split_names = sorted(set(hash_splits) | {c.split for c in listing.candidates if c.split},
                             key=sources.split_sort_key)
        # Ids follow the sorted class names (folders or manifest labels), like Keras'
        # image_dataset_from_directory, so they are known before any file is decoded.
        label_map = {name: i for i, name in enumerate(listing.classes)}
        logging.info("ImageExampleGen: %d files from %s (%s layout), %d hidden files skipped, classes %s",
                     len(listing.candidates), listing.source, listing.layout, listing.skipped_hidden,
                     label_map)

        staging = fs.join(examples.uri, ".staging")
        processes = local_processes(self._beam_pipeline_args, listing.candidates)
        batch_files = []
        for n, batch in enumerate(batches(ingest_order(listing.candidates, settings.seed), processes)):
            batch_files.append(fs.join(staging, "candidates", f"batch-{n:06d}.json"))
            batch_ingest.write_candidates(batch, batch_files[-1])
        ingest_settings = batch_ingest.Settings(
            staging_dir=staging, label_ids=label_map, hash_splits=hash_splits, buckets=buckets,
            max_pixels=settings.max_pixels, compression_level=settings.compression_level,
            shard_bytes=settings.shard_megabytes << 20, store_max_pixels=settings.store_max_pixels)
        results_path = fs.join(staging, "results.json")
        started = time.monotonic()
        quiet_pickler_trace()
        with self._make_beam_pipeline() as p:
            inspected = (
                p
                # File names travel in batch files: a Create of a million names would exceed
                # Dataflow's 10 MB limit on job graphs. Locally the DoFn spreads batches over its
                # own processes, so Beam's reshuffle (which spreads them over workers) is skipped.
                | "CandidateBatches" >> beam.Create(batch_files, reshuffle=processes == 1)
                | "InspectAndWrite" >> beam.ParDo(beam_steps.InspectAndWrite(
                    ingest_settings, processes, total_files=len(listing.candidates)))
                .with_outputs("results", main="metas"))
            resolved = (inspected.metas
                        | "KeyByHash" >> beam.Map(beam_steps.key_by_hash)
                        | "GroupByHash" >> beam.GroupByKey()
                        | "Resolve" >> beam.ParDo(beam_steps.Resolve(settings.drop_duplicates)))
            # Near-duplicates: images that share a band of their perceptual hash are compared (near_duplicates.py).
            limits = (inspected.metas
                      | "SampleSignatures" >> beam.combiners.Sample.FixedSizeGlobally(near_duplicates.SAMPLE)
                      | "Limits" >> beam.Map(near_duplicates.limits_from))
            near_pairs = (inspected.metas
                          | "BatchMetas" >> beam.BatchElements(min_batch_size=near_duplicates.BATCH,
                                                               max_batch_size=near_duplicates.BATCH)
                          | "BandKeys" >> beam.FlatMap(near_duplicates.band_items,
                                                       similarity.band_width(len(listing.candidates)))
                          | "GroupByBand" >> beam.GroupByKey()
                          | "NearPairs" >> beam.FlatMap(near_duplicates.bucket_pairs, beam.pvalue.AsSingleton(limits))
                          | "AsResult" >> beam.Map(lambda pair: ("near_pairs", [list(pair[0]), list(pair[1])])))
            # The small results go through one file, checked after the run.
            _ = ((inspected.results, resolved, near_pairs)
                 | "AllResults" >> beam.Flatten()
                 | "Collect" >> beam.CombineGlobally(beam_steps.CollectResults())
                 | "Save" >> beam.Map(beam_steps.save_json, results_path))
        elapsed = time.monotonic() - started

        found = _read_json(results_path)
        rejected = [(batch_ingest.Meta(*meta), row) for meta, row in found["rejected"]]
        pairs = {(a[1], b[1]): (batch_ingest.Meta(*a), batch_ingest.Meta(*b)) for a, b in found["near_pairs"]}
        groups = near_duplicates.group(list(pairs.values()), removed=[meta.rel_path for meta, _ in rejected])
        eval_written = sum(n for *key, n in found["written"] if key[0] == "eval")  # [split, label, format, copy, n]
        near, near_rejected = near_duplicates.decide(groups, settings.near_duplicates, eval_written)
        rejected += near_rejected
        finalize_shards([batch_ingest.Shard(*s) for s in found["shard"]], rejected, examples.uri,
                        split_names, settings.compression_level)
        io_utils.delete_dir(staging)

        bad = found["bad"] + [row for _, row in rejected]
        counts = collections.Counter({tuple(k): n for *k, n in found["written"]})
        for meta, _ in rejected:
            counts[(meta.split, meta.label, meta.format, meta.downscaled)] -= 1
        summary = build_summary(listing, counts, bad, label_map, split_names, found["duplicates"])
        summary.update(near)
        summary["store_max_pixels"] = settings.store_max_pixels
        summary["seconds"] = round(elapsed, 2)
        summary["files_per_second"] = round(len(listing.candidates) / max(elapsed, 1e-9), 1)
        check_summary(summary, settings.max_bad_fraction, listing.source)

        examples.split_names = artifact_utils.encode_split_names(split_names)
        examples_utils.set_payload_format(examples, example_gen_pb2.FORMAT_TF_EXAMPLE)
        examples_utils.set_file_format(examples, "tfrecords_gzip")
        _write_json(label_map, os.path.join(examples.uri, LABEL_MAP_FILE))
        # Size bins count every written example, a rejected duplicate copy included (rare; a bin off
        # by one does not change a distance).
        _write_json(drift.make_profile(summary["examples_per_split_and_class"], summary["formats"], found["sizes"]),
                    os.path.join(examples.uri, PROFILE_FILE))
        _write_json(label_map, os.path.join(report.uri, LABEL_MAP_FILE))
        _write_json(summary, os.path.join(report.uri, SUMMARY_FILE))
        io_utils.write_string_file(os.path.join(report.uri, QUARANTINE_FILE), quarantine_csv(bad))
        io_utils.write_string_file(os.path.join(report.uri, NEAR_DUPLICATES_FILE),
                                   csv_text(NEAR_DUPLICATE_COLUMNS, near_duplicates.csv_rows(groups)))
        for key in ("files_seen", "examples_written", "quarantined", "skipped_hidden", "downscaled"):
            report.set_int_custom_property(key, summary[key])
        report.set_string_custom_property("label_map", json.dumps(label_map, ensure_ascii=False))
        report.set_string_custom_property("layout", listing.layout)
        log_summary(summary)


# Below both, the files are ingested in the executor's own process: worker processes would cost more CPU
# than they save time (measured, small PNG/JPEG digits, 2 cores: 300 files 0.86 s wall inline or with two
# workers, which took 0.37 s more CPU; 800 files 1.62 s inline, 1.44 s with two; 1,797 files 3.02 s, 2.45 s).
INLINE_MAX_FILES = 1000
INLINE_MAX_BYTES = 16 << 20


def local_processes(beam_args: List[str], candidates: List[sources.Candidate]) -> int:
    """Worker processes for InspectAndWrite with the in-memory DirectRunner: --direct_num_workers if given
    (0: one per core), else one per core, or none (1: inline) for a small input. Other runners (Dataflow,
    Beam's multi_processing mode) already run a worker per core, and get 1."""
    options = PipelineOptions(beam_args or [])
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    direct = options.view_as(DirectOptions)
    if runner not in ("DirectRunner", "direct") or direct.direct_running_mode == "multi_processing":
        return 1
    if any(arg.split("=", 1)[0] == "--direct_num_workers" for arg in beam_args or []):
        return max(1, direct.direct_num_workers or cpu_count())
    if len(candidates) < INLINE_MAX_FILES and sum(c.size if c.size >= 0 else INLINE_MAX_BYTES
                                                  for c in candidates) < INLINE_MAX_BYTES:
        return 1
    return cpu_count()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS)
        return os.cpu_count() or 1


def ingest_order(candidates: List[sources.Candidate], seed: int) -> List[sources.Candidate]:
    """The candidates in an order shuffled with `seed`: each batch, and so each shard and the whole
    split, mixes the classes. In the listing's order (one class folder after another) the examples
    would reach the Trainer a class at a time, which no shuffle buffer smaller than the data undoes.
    Keyed by path, so the same seed gives the same order, and a file added keeps the others' order."""
    def key(c: sources.Candidate) -> bytes:
        return hashlib.sha256(f"{seed}\0{c.rel_path}".encode("utf-8", "surrogateescape")).digest()

    return sorted(candidates, key=key)


def batches(candidates: List[sources.Candidate], processes: int) -> List[List[sources.Candidate]]:
    """About two batches per process, 64 to 2,000 files each: enough work to spread, few shards."""
    size = min(2000, max(64, -(-len(candidates) // (2 * processes))))
    return [candidates[i:i + size] for i in range(0, len(candidates), size)]


def finalize_shards(shards: List[batch_ingest.Shard], rejected: List[Tuple[batch_ingest.Meta, dict]],
                    examples_uri: str, split_names: List[str], level: int) -> None:
    """Moves staging shards to Split-<name>/data_tfrecord-NNNNN-of-NNNNN.gz.

    A shard that holds a rejected copy is rewritten without it (rare: it takes
    the same bytes under two labels or in two splits).
    """
    drop: Dict[str, Set[int]] = collections.defaultdict(set)
    for meta, _ in rejected:
        drop[meta.shard].add(meta.index)
    for split in split_names:
        mine = sorted((s for s in shards if s.split == split), key=lambda s: s.path)
        keep = [s for s in mine if s.records > len(drop.get(s.path, ()))]
        split_dir = fs.join(examples_uri, f"Split-{split}")
        if not fs.is_remote(split_dir):
            os.makedirs(split_dir, exist_ok=True)  # object stores have no folders to make
        for i, shard in enumerate(keep):
            dest = fs.join(split_dir, f"data_tfrecord-{i:05d}-of-{len(keep):05d}.gz")
            if shard.path not in drop:
                FileSystems.rename([shard.path], [dest])
                continue
            with FileSystems.open(shard.path, compression_type=CompressionTypes.UNCOMPRESSED) as src:
                writer = tfrecord_io.GzipTFRecordWriter(
                    FileSystems.create(dest, compression_type=CompressionTypes.UNCOMPRESSED), level)
                for index, record in enumerate(tfrecord_io.read_gzip_tfrecords(src)):
                    if index not in drop[shard.path]:
                        writer.write(record)
                writer.close()
