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
import csv
import io
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
from components.image_example_gen import (LABEL_MAP_FILE, PROFILE_FILE, QUARANTINE_FILE, SUMMARY_FILE, batch_ingest,
                                          beam_steps, sources, tfrecord_io)
from components.image_example_gen.image_check import Reason
from components.image_example_gen.ingest_settings import REPORT_KEY, IngestSettings

QUARANTINE_COLUMNS = ("path", "reason", "detail", "label", "split")


class IngestionError(RuntimeError):
    """The run cannot produce usable examples; one line that says why and what to do."""


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

        staging = sources.join(examples.uri, ".staging")
        processes = local_processes(self._beam_pipeline_args)
        batch_files = []
        for n, batch in enumerate(batches(listing.candidates, processes)):
            batch_files.append(sources.join(staging, "candidates", f"batch-{n:06d}.json"))
            batch_ingest.write_candidates(batch, batch_files[-1])
        ingest_settings = batch_ingest.Settings(
            staging_dir=staging, label_ids=label_map, hash_splits=hash_splits, buckets=buckets,
            max_pixels=settings.max_pixels, compression_level=settings.compression_level,
            shard_bytes=settings.shard_megabytes << 20, store_max_pixels=settings.store_max_pixels)
        results_path = sources.join(staging, "results.json")
        started = time.monotonic()
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
            # The small results go through one file, checked after the run.
            _ = ((inspected.results, resolved)
                 | "AllResults" >> beam.Flatten()
                 | "Collect" >> beam.CombineGlobally(beam_steps.CollectResults())
                 | "Save" >> beam.Map(beam_steps.save_json, results_path))
        elapsed = time.monotonic() - started

        found = _read_json(results_path)
        rejected = [(batch_ingest.Meta(*meta), row) for meta, row in found["rejected"]]
        finalize_shards([batch_ingest.Shard(*s) for s in found["shard"]], rejected, examples.uri,
                        split_names, settings.compression_level)
        io_utils.delete_dir(staging)

        bad = found["bad"] + [row for _, row in rejected]
        counts = collections.Counter({tuple(k): n for *k, n in found["written"]})
        for meta, _ in rejected:
            counts[(meta.split, meta.label, meta.format, meta.downscaled)] -= 1
        summary = build_summary(listing, counts, bad, label_map, split_names, found["duplicates"])
        summary["store_max_pixels"] = settings.store_max_pixels
        summary["seconds"] = round(elapsed, 2)
        summary["files_per_second"] = round(len(listing.candidates) / max(elapsed, 1e-9), 1)
        check_summary(summary, settings, listing.source)

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
        for key in ("files_seen", "examples_written", "quarantined", "skipped_hidden", "downscaled"):
            report.set_int_custom_property(key, summary[key])
        report.set_string_custom_property("label_map", json.dumps(label_map, ensure_ascii=False))
        report.set_string_custom_property("layout", listing.layout)
        log_summary(summary)


def local_processes(beam_args: List[str]) -> int:
    """Worker processes for InspectAndWrite: one per core with the in-memory DirectRunner, else 1.

    Other runners (Dataflow, Beam's multi_processing mode) already run a worker per core.
    """
    options = PipelineOptions(beam_args or [])
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    mode = options.view_as(DirectOptions).direct_running_mode
    if runner not in ("DirectRunner", "direct") or mode == "multi_processing":
        return 1
    return cpu_count()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS)
        return os.cpu_count() or 1


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
        split_dir = sources.join(examples_uri, f"Split-{split}")
        if not sources.is_remote(split_dir):
            os.makedirs(split_dir, exist_ok=True)  # object stores have no folders to make
        for i, shard in enumerate(keep):
            dest = sources.join(split_dir, f"data_tfrecord-{i:05d}-of-{len(keep):05d}.gz")
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


def build_summary(listing: sources.Listing, counts: Dict[tuple, int], bad: List[Dict[str, str]],
                  label_map: Dict[str, int], split_names: List[str],
                  duplicates: List[List[str]]) -> Dict[str, Any]:
    """Everything a person or a test wants to know about the run, as plain JSON."""
    per_split: Dict[str, Dict[str, int]] = {s: {} for s in split_names}
    formats: Dict[str, int] = collections.Counter()
    written = downscaled = 0
    for (split, label, fmt, is_copy), n in sorted(counts.items()):
        if n == 0:
            continue
        per_split.setdefault(split, {})[label] = per_split.get(split, {}).get(label, 0) + n
        formats[fmt] += n
        written += n
        downscaled += n if is_copy else 0
    reasons = collections.Counter(row["reason"] for row in bad)
    return {
        "source": listing.source,
        "layout": listing.layout,
        "files_seen": len(listing.candidates),
        "examples_written": written,
        "downscaled": downscaled,  # examples holding a copy within store_max_pixels
        "quarantined": len(bad),
        "skipped_hidden": listing.skipped_hidden,
        "bad_fraction": round(len(bad) / max(1, len(listing.candidates)), 6),
        "quarantine_reasons": dict(sorted(reasons.items())),
        "examples_per_split": {s: sum(c.values()) for s, c in per_split.items()},
        "examples_per_split_and_class": per_split,
        "formats": dict(sorted(formats.items())),
        "label_map": label_map,
        "classes_without_examples": sorted(
            set(label_map) - {label for c in per_split.values() for label, n in c.items() if n}),
        "label_conflicts": reasons.get(Reason.LABEL_CONFLICT, 0),
        # Groups of files with identical bytes (each group in one split, or quarantined).
        "duplicate_groups": len(duplicates),
        "duplicate_files": sum(len(g) for g in duplicates),
        "duplicate_examples": sorted(duplicates)[:20],
    }


def check_summary(summary: Dict[str, Any], settings: IngestSettings, source: str) -> None:
    """Enforces the accounting invariant and the user's limits; raises IngestionError."""
    seen, written, bad = summary["files_seen"], summary["examples_written"], summary["quarantined"]
    if seen != written + bad:
        raise IngestionError(f"internal error: {seen} files seen but {written} written + {bad} quarantined")
    top = ", ".join(f"{r} {n}" for r, n in sorted(summary["quarantine_reasons"].items(), key=lambda kv: -kv[1]))
    if written == 0:
        raise IngestionError(
            f"{source}: no valid image among {seen} files (quarantined: {top}); "
            "check that the path holds JPEG, PNG, GIF or BMP images")
    if summary["bad_fraction"] > settings.max_bad_fraction:
        raise IngestionError(
            f"{source}: {bad} of {seen} files ({summary['bad_fraction']:.1%}) were quarantined ({top}), "
            f"over the limit of {settings.max_bad_fraction:.1%}; fix or remove them, or raise --max-bad-fraction")
    with_examples = sorted(set(summary["label_map"]) - set(summary["classes_without_examples"]))
    if len(with_examples) < 2:
        raise IngestionError(
            f"{source}: valid images in only one class ({', '.join(with_examples)}); "
            "a classifier needs at least two")
    for split, n in summary["examples_per_split"].items():
        if n == 0:
            raise IngestionError(
                f"{source}: split {split!r} has no valid examples; add images (or a {split}/ folder) "
                "or change the split ratios")
    train = summary["examples_per_split_and_class"].get("train", {})
    untrained = sorted(label for label in with_examples if not train.get(label))
    if untrained:
        # The model learns its classes from train: these would have no output, and their eval labels no id.
        raise IngestionError(
            f"{source}: classes with no training example: {', '.join(untrained)}; add images of them "
            "(a class needs at least a few to land some in train), or remove them")
    if summary["classes_without_examples"]:
        logging.warning("ImageExampleGen: classes with no valid image: %s",
                        summary["classes_without_examples"])


# A cell starting with one of these is a formula to spreadsheet programs (CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value) -> str:
    """The cell as text, with a leading apostrophe where a spreadsheet would run it as a formula."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def quarantine_csv(rows: List[Dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=QUARANTINE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in sorted(rows, key=lambda r: (r["path"], r["reason"])):
        writer.writerow({k: spreadsheet_safe(v) for k, v in row.items()})
    return out.getvalue()


def log_summary(summary: Dict[str, Any]) -> None:
    logging.info(
        "ImageExampleGen: %d files seen, %d examples written %s, %d quarantined %s, %d hidden skipped",
        summary["files_seen"], summary["examples_written"], summary["examples_per_split"],
        summary["quarantined"], summary["quarantine_reasons"], summary["skipped_hidden"])


def read_report(report_uri: str) -> Dict[str, Any]:
    """The summary a run wrote (for the CLI and tests)."""
    return json.loads(io_utils.read_string_file(os.path.join(report_uri, SUMMARY_FILE)))

