"""Beam executor of ImageExampleGen: image files -> validated, split, sharded tf.Examples.

The Beam graph, per run:

  candidate batch files --InspectAndWrite--> staging shards (gzip TFRecords, one pass over the bytes)
                               |--> Meta per example --GroupByKey(sha256)--> Resolve --> copies to remove
                               |--> Pending per file near its class's split boundary (stratify.py)
                                      --placement.py: placed by rank per stratum, pending shards rewritten by split
                               |--> quarantine rows, closed shards, counts, notes --> results.json

Then, outside Beam, near-duplicates are decided on the final splits and the shards finalized: renamed to
Split-<split>/data_tfrecord-NNNNN-of-NNNNN.gz (the rare shard holding a rejected copy is rewritten). Only metadata
goes through the shuffles and only counts, shards and problem files reach this process, so memory does not grow
with the bytes of the corpus, and each file is read once.
"""

import collections
import hashlib
import json
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional

import apache_beam as beam
from absl import logging
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from tfx import types
from tfx.components.example_gen import utils as example_gen_utils
from tfx.components.util import examples_utils
from tfx.dsl.components.base import base_beam_executor
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils

from components import drift
from components.beam_dependencies import NoTfxPackageForLocalRunners, runs_on_this_machine
from components.beam_overheads import cut_overheads
from components.example_gen import (
    FAILED_DIR,
    LABEL_MAP_FILE,
    NEAR_DUPLICATES_FILE,
    PROFILE_FILE,
    QUARANTINE_FILE,
    SUMMARY_FILE,
    ingest_report,
)
from components.example_gen.ingest_report import (
    NEAR_DUPLICATE_COLUMNS,
    build_summary,
    check_summary,
    log_summary,
    quarantine_csv,
)
from components.example_gen.ingest_settings import REPORT_KEY, IngestSettings
from components.example_gen.splitting import placement, shards, stratify
from components.example_gen.writing import batch_ingest, beam_steps
from images.finding import sources
from images.finding.listing import Candidate, Listing, labels_of, split_sort_key
from images.image_check import Reason, bad_row
from images.near_duplicates import grouping
from stacks import IN_PROCESS_BEAM_RUNNERS
from storage import files as fs
from storage import review_file
from storage.spreadsheet import csv_text


def _write_json(value: Any, path: str) -> None:
    io_utils.write_string_file(path, json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False))


def _read_json(path: str) -> Any:
    return json.loads(io_utils.read_string_file(path))


class SplitPlan(NamedTuple):
    """How the files without a split of their own are split: the hash-assigned splits, each split's share of a
    class, and for multi-label files the strata of their rarest label (stratify.py)."""

    hash_splits: List[str]
    shares: Any
    strata: Optional[stratify.LabelStrata]


class Executor(NoTfxPackageForLocalRunners, base_beam_executor.BaseBeamExecutor):
    """Ingests image files into tf.Examples; see the module docstring for the graph."""

    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        examples = artifact_utils.get_single_instance(output_dict[standard_component_specs.EXAMPLES_KEY])
        report = artifact_utils.get_single_instance(output_dict[REPORT_KEY])
        settings = IngestSettings.from_exec_properties(exec_properties)
        listing = usable_listing(settings, report.uri)
        hash_splits, buckets = settings.output_splits()
        split_names = sorted(set(hash_splits) | {c.split for c in listing.candidates if c.split}, key=split_sort_key)
        # Ids follow the sorted class names (folders or manifest labels), like Keras'
        # image_dataset_from_directory, so they are known before any file is decoded.
        label_map = {name: i for i, name in enumerate(listing.classes)}
        logging.info(
            "ImageExampleGen: %d files from %s (%s layout, %s-label), %d hidden files skipped, classes %s",
            len(listing.candidates),
            listing.source,
            listing.layout,
            listing.task,
            listing.skipped_hidden,
            label_map,
        )
        staging = fs.join(examples.uri, ".staging")
        shares = stratify.shares(buckets)
        strata = (
            stratify.label_strata((c.label for c in listing.candidates if not c.split), shares)
            if listing.task == "multi"
            else None
        )  # multi-label files are split by their rarest label
        review = review_decisions(settings.review, listing)
        splits = SplitPlan(hash_splits, shares, strata)
        found, found_pairs, elapsed, search = self._inspect_and_write(
            listing, settings, staging, label_map, splits, review
        )
        placed = place_and_finalize(found, found_pairs, settings, staging, examples.uri, split_names)
        io_utils.delete_dir(staging)

        summary = build_summary(listing, placed.counts, placed.bad, label_map, split_names, found["duplicates"])
        summary.update(placed.near)
        summary["split_notes"] = placed.notes
        summary["store_max_pixels"] = settings.store_max_pixels
        summary["seconds"] = round(elapsed, 2)
        summary["near_duplicate_search"] = search
        summary["files_per_second"] = round(len(listing.candidates) / max(elapsed, 1e-9), 1)
        if settings.review:
            check_review_unchanged(settings.review, exec_properties)
            summary["review"] = review_summary(settings.review, review, found["reviewed"], listing, placed.bad)
        try:
            check_summary(summary, settings.max_bad_fraction, listing.source)
        except ingest_report.IngestionError as e:  # the run stops: its outputs go, so the list is kept apart
            kept = keep_failed(report.uri, placed.bad, summary)
            raise ingest_report.IngestionError(f"{e}; every quarantined file, with its reason: {kept}") from None
        write_outputs(examples, report, listing, label_map, split_names, summary, placed)
        log_summary(summary)

    def _inspect_and_write(
        self,
        listing: Listing,
        settings: IngestSettings,
        staging: str,
        label_map: Dict[str, int],
        splits: "SplitPlan",
        review: Optional[Dict[str, Any]] = None,
    ):
        """Every file inspected and written in one Beam pass (this machine's processes, or Dataflow's workers),
        and the near-duplicate pairs: (what Beam found, the pairs, seconds, where the search ran)."""
        processes = local_processes(self._beam_pipeline_args, listing.candidates)
        batch_files = write_candidate_batches(listing, settings.seed, staging, processes)
        searched = settings.near_duplicates != "off"
        in_memory = near_search_in_memory(self._beam_pipeline_args, len(listing.candidates))
        ingest_settings = batch_settings(listing, settings, staging, label_map, splits, review, in_memory)
        results_path = fs.join(staging, "results.json")
        started = time.monotonic()
        cut_overheads()
        with self._make_beam_pipeline() as p:
            inspect_and_write_stages(
                p,
                batch_files,
                processes,
                ingest_settings,
                len(listing.candidates),
                splits.shares,
                near_in_beam=searched and not in_memory,
                results_path=results_path,
            )
        found = _read_json(results_path)
        if not searched:
            return found, [], time.monotonic() - started, {"where": "off"}
        if not in_memory:
            pairs = [(batch_ingest.Meta(*a), batch_ingest.Meta(*b)) for a, b in found["near_pairs"]]
            return found, pairs, time.monotonic() - started, {"where": "beam"}
        near_started = time.monotonic()  # near-duplicates in this process (images/near_duplicates/grouping.py)
        found_pairs = grouping.search_files(found["signatures"], len(listing.candidates))
        pairs = [(batch_ingest.Meta(*a), batch_ingest.Meta(*b)) for a, b in found_pairs]
        near_seconds = time.monotonic() - near_started
        return found, pairs, time.monotonic() - started, {"where": "memory", "seconds": round(near_seconds, 2)}


def write_candidate_batches(listing: Listing, seed: int, staging: str, processes: int) -> List[str]:
    """The candidates in shuffled batches, each in a staging file: the files InspectAndWrite reads."""
    batch_files = []
    for n, batch in enumerate(batches(ingest_order(listing.candidates, seed), processes)):
        batch_files.append(fs.join(staging, "candidates", f"batch-{n:06d}.json"))
        batch_ingest.write_candidates(batch, batch_files[-1])
    return batch_files


def batch_settings(
    listing: Listing,
    settings: IngestSettings,
    staging: str,
    label_map: Dict[str, int],
    splits: SplitPlan,
    review: Optional[Dict[str, Any]],
    in_memory: bool,
) -> batch_ingest.Settings:
    """What each InspectAndWrite batch needs to know, the strata's split bands included. `in_memory`: the
    near-duplicate search runs in this process (the workers write their signatures to files)."""
    # The classes' counts that place their files (stratify.py), with the review's relabels by path: a file
    # relabelled is placed in its new class.
    relabelled = {
        review["paths"][key]: new
        for key, (action, new, _) in (review or {}).get("apply", {}).items()
        if action == "relabel"
    }
    unsplit = collections.Counter(
        stratify.stratum(relabelled.get(c.rel_path, c.label), splits.strata) for c in listing.candidates if not c.split
    )
    return batch_ingest.Settings(
        declared=settings.declared(),
        staging_dir=staging,
        label_ids=label_map,
        hash_splits=splits.hash_splits,
        bands=stratify.bands(dict(unsplit), splits.shares),
        strata=splits.strata,
        signatures_in_files=in_memory,
        sign=settings.near_duplicates != "off",
        multi_label=listing.task == "multi",
        review=(review or {}).get("apply", {}),
    )


def inspect_and_write_stages(
    p,
    batch_files: List[str],
    processes: int,
    ingest_settings: batch_ingest.Settings,
    total_files: int,
    shares,
    near_in_beam: bool,
    results_path: str,
) -> None:
    """The Beam graph (see the module docstring); its small results go to `results_path`. What the batches know
    (`ingest_settings`: the declared settings, staging, the splits and strata) the later stages read too."""
    declared, staging, strata = ingest_settings.declared, ingest_settings.staging_dir, ingest_settings.strata
    inspected = (
        p
        # File names travel in batch files: a Create of a million names would exceed
        # Dataflow's 10 MB limit on job graphs. Locally the DoFn spreads batches over its
        # own processes, so Beam's reshuffle (which spreads them over workers) is skipped.
        | "CandidateBatches" >> beam.Create(batch_files, reshuffle=processes == 1)
        | "InspectAndWrite"
        >> beam.ParDo(beam_steps.InspectAndWrite(ingest_settings, processes, total_files=total_files)).with_outputs(
            "results", "pending", main="metas"
        )
    )
    resolved = (
        inspected.metas
        | "KeyByHash" >> beam.Map(beam_steps.key_by_hash)
        | "GroupByHash" >> beam.GroupByKey()
        | "Resolve" >> beam.ParDo(beam_steps.Resolve(declared.drop_duplicates))
    )
    # The pending files placed by rank in their stratum, and their shards rewritten (placement.py).
    assigned = placement.stratum_items(inspected.results, resolved, inspected.pending, strata) | "Assign" >> beam.ParDo(
        placement.Assign(ingest_settings.hash_splits, shares)
    ).with_outputs("results", main="placed")
    rewritten = (
        assigned.placed
        | "ByPendingShard" >> beam.GroupByKey()
        | "Rewrite"
        >> beam.ParDo(placement.Rewrite(staging, declared.compression_level, declared.shard_megabytes << 20))
    )
    outputs = [inspected.results, resolved, assigned.results, rewritten]
    if near_in_beam:  # near-duplicates through Beam's shuffle (else after the run)
        outputs.append(near_pairs_in_beam(inspected.metas, total_files))
    # The small results go through one file, checked after the run.
    _ = (
        tuple(outputs)
        | "AllResults" >> beam.Flatten()
        | "Collect" >> beam.CombineGlobally(beam_steps.CollectResults())
        | "Save" >> beam.Map(beam_steps.save_json, results_path)
    )


def review_decisions(path: str, listing: Listing) -> Dict[str, Any]:
    """A review file's decisions that change something: {"apply": content hash -> (action, new label, file) for
    batch_ingest.Settings.review, "paths": content hash -> the path it was reviewed at, "refused": [row]: relabels
    to a label this data does not have}."""
    if not path:
        return {}
    apply, paths, refused = {}, {}, []
    classes = set(listing.classes)
    for key, d in review_file.changes(review_file.read(path)).items():
        unknown = (
            sorted(set(labels_of(d.new_label) if listing.task == "multi" else [d.new_label]) - classes)
            if d.action == "relabel"
            else []
        )
        if unknown:
            refused.append(
                {
                    "path": d.path,
                    "key": key,
                    "action": d.action,
                    "new_label": d.new_label,
                    "why": f"{', '.join(unknown)} is not a class of this data",
                }
            )
        else:
            apply[key] = (d.action, d.new_label, os.path.basename(path))
            paths[key] = d.path
    return {"apply": apply, "paths": paths, "refused": refused}


def review_summary(
    path: str, review: Dict[str, Any], reviewed: List[List[str]], listing: Listing, bad: List[Dict[str, Any]]
) -> Dict:
    """What a review file changed: files relabelled (to another label than they had) and excluded, and the
    decisions not applied (the image is gone, quarantined before it was read, or changed since it was reviewed:
    its content hash differs; or its new label is not a class)."""
    applied = {key for key, _ in reviewed}  # the content hashes met
    listed = {c.rel_path for c in listing.candidates}
    quarantined = {row["path"]: row["reason"] for row in bad if row["reason"] != Reason.EXCLUDED_BY_REVIEW}
    not_applied = list(review["refused"])
    for key, (action, new_label, _) in sorted(review["apply"].items(), key=lambda kv: review["paths"][kv[0]]):
        if key not in applied:
            where = review["paths"][key]
            why = (
                f"quarantined ({quarantined[where]})"
                if where in quarantined
                else "changed since the review (its content hash differs)"
                if where in listed
                else "not in this data"
            )
            not_applied.append({"path": where, "key": key, "action": action, "new_label": new_label, "why": why})
    return {
        "file": path,
        "decisions": len(review["apply"]) + len(review["refused"]),
        "relabelled": sum(action == "relabel" for _, action in reviewed),  # files: exact copies each
        "excluded": sum(action == "exclude" for _, action in reviewed),
        "not_applied": not_applied,
    }


def check_review_unchanged(path: str, exec_properties: Dict[str, Any]) -> None:
    """The decisions applied are those the driver fingerprinted (a cached ingestion is reused on them): a decision
    added while the run read the files stops it in one line."""
    expected = exec_properties.get(example_gen_utils.FINGERPRINT_PROPERTY_NAME) or ""
    if expected and not expected.endswith(review_file.fingerprint(path)):
        raise ingest_report.IngestionError(
            f"--review {path}: decisions were added while this run read the files; "
            "run again (the new decisions then apply)"
        )


def usable_listing(settings: IngestSettings, report_uri: str) -> Listing:
    """The files to ingest, or a one-line error; rows quarantined before any file is read (outside the data root,
    missing, no label) are then listed where the failed run leaves them, for the user to fix."""
    listing = settings.list_inputs()
    try:
        sources.check_usable(listing)
    except sources.DataError as e:
        rows = [bad_row(c.rel_path, *c.problem, c.label, c.split) for c in listing.candidates if c.problem]
        if not rows:
            raise
        kept = keep_failed(report_uri, rows, None)
        raise ingest_report.IngestionError(f"{e}; every quarantined file or row, with its reason: {kept}") from None
    return listing


class Placed(NamedTuple):
    """What ingestion wrote, once every example is in its split: counts per (split, label, format, copy), sizes
    per (split, side, bin), quarantine rows, near-duplicate groups and figures, split notes."""

    counts: collections.Counter
    sizes: collections.Counter
    bad: List[Dict[str, Any]]
    groups: list
    near: Dict[str, Any]
    notes: List[str]


def place_and_finalize(
    found, found_pairs, settings: IngestSettings, staging: str, examples_uri: str, split_names: List[str]
) -> Placed:
    """Near-duplicates decided on the files' final splits (the pending files were placed in Beam: placement.py),
    and the shards renamed (or, the rare one holding a rejected copy, rewritten) into their Split-* folders."""
    counts = collections.Counter({tuple(k): n for *k, n in found["written"]})  # (split, label, format, copy)
    sizes = collections.Counter({tuple(k): n for *k, n in found["sizes"]})  # (split, side, bin)
    rejected_split = {(shard, index): split for shard, index, split in found["rejected_split"]}
    rejected = [(batch_ingest.Meta(*meta), row) for meta, row in found["rejected"]]
    where = placement.moved(
        [m for m, _ in rejected] + [m for pair in found_pairs for m in pair], dict(found["moves"]), rejected_split
    )

    def placed(meta: batch_ingest.Meta) -> batch_ingest.Meta:
        return where.get((meta.shard, meta.index), meta)

    rejected = [(placed(meta), {**row, "split": placed(meta).split}) for meta, row in rejected]
    pairs = {(a.rel_path, b.rel_path): (placed(a), placed(b)) for a, b in found_pairs}
    groups = grouping.group(list(pairs.values()), removed=[meta.rel_path for meta, _ in rejected])
    eval_written = sum(n for key, n in counts.items() if key[0] == "eval")
    near, near_rejected = grouping.decide(groups, settings.near_duplicates, eval_written)
    if settings.near_duplicates == "off":  # not 0: unknown (the card, the report and data health say so)
        near.update({key: None for key in grouping.SEARCHED_FIGURES})
    rejected += near_rejected
    shards.finalize_shards(
        [batch_ingest.Shard(*s) for s in found["shard"]],
        rejected,
        examples_uri,
        split_names,
        settings.compression_level,
        placement.placed_dir(staging),
    )
    for meta, _ in rejected:
        counts[(meta.split, meta.label, meta.format, meta.downscaled)] -= 1
    notes = [note for _, note in sorted(found["notes"])]  # by stratum
    for note in notes:
        logging.warning("ImageExampleGen: %s", note)
    return Placed(counts, sizes, found["bad"] + [row for _, row in rejected], groups, near, notes)


def write_outputs(
    examples,
    report,
    listing: Listing,
    label_map: Dict[str, int],
    split_names: List[str],
    summary: Dict[str, Any],
    placed: Placed,
) -> None:
    """The examples' split names, label map and data profile; the report's summary, quarantine and near-duplicate
    lists, and its properties."""
    examples.split_names = artifact_utils.encode_split_names(split_names)
    examples_utils.set_payload_format(examples, example_gen_pb2.FORMAT_TF_EXAMPLE)
    examples_utils.set_file_format(examples, "tfrecords_gzip")
    _write_json(label_map, os.path.join(examples.uri, LABEL_MAP_FILE))
    # Size bins count every written example, a rejected duplicate copy included (rare; a bin off
    # by one does not change a distance).
    _write_json(
        drift.make_profile(
            summary["examples_written"],
            summary["examples_per_split_and_class"],
            summary["formats"],
            [[*k, n] for k, n in placed.sizes.items() if n],
            summary["examples_per_split"],
        ),
        os.path.join(examples.uri, PROFILE_FILE),
    )
    _write_json(label_map, os.path.join(report.uri, LABEL_MAP_FILE))
    _write_json(summary, os.path.join(report.uri, SUMMARY_FILE))
    io_utils.write_string_file(os.path.join(report.uri, QUARANTINE_FILE), quarantine_csv(placed.bad))
    io_utils.write_string_file(
        os.path.join(report.uri, NEAR_DUPLICATES_FILE),
        csv_text(NEAR_DUPLICATE_COLUMNS, grouping.csv_rows(placed.groups)),
    )
    for key in ("files_seen", "examples_written", "quarantined", "skipped_hidden", "downscaled"):
        report.set_int_custom_property(key, summary[key])
    report.set_string_custom_property("label_map", json.dumps(label_map, ensure_ascii=False))
    report.set_string_custom_property("layout", listing.layout)


def near_search_in_memory(beam_args: List[str], files: int) -> bool:
    """Whether the near-duplicate search runs in the executor's memory after the Beam run: on the local runners,
    up to grouping.MEMORY_MAX_IMAGES; otherwise (Dataflow, more images) as Beam stages."""
    return runs_on_this_machine(beam_args) and files <= grouping.MEMORY_MAX_IMAGES


def near_pairs_in_beam(metas, images: int):
    """The near-duplicate search as Beam stages (images/near_duplicates/grouping.py): the pairs, as ("near_pairs", [a, b])."""
    limits = (
        metas
        | "Signed" >> beam.Filter(lambda meta: bool(meta.signature))
        | "SampleSignatures" >> beam.combiners.Top.Smallest(grouping.SAMPLE, key=grouping.sample_key)
        | "Limits" >> beam.Map(grouping.limits_from)
    )
    return (
        metas
        | "BatchMetas" >> beam.BatchElements(min_batch_size=grouping.BATCH, max_batch_size=grouping.BATCH)
        | "BandKeys" >> beam.FlatMap(grouping.band_items, beam.pvalue.AsSingleton(limits), images)
        | "GroupByBand" >> beam.GroupByKey()
        | "NearPairs" >> beam.FlatMap(grouping.bucket_pairs, beam.pvalue.AsSingleton(limits))
        | "AsResult" >> beam.Map(lambda pair: ("near_pairs", [list(pair[0]), list(pair[1])]))
    )


def keep_failed(report_uri: str, bad: List[Dict[str, str]], summary: Optional[Dict[str, Any]]) -> str:
    """Writes the quarantine list (and the summary) of an ingestion that fails where the run leaves them: TFX
    removes a failed execution's outputs, and the user needs the list to fix the data. Returns the CSV's path."""
    component_dir = os.path.dirname(os.path.dirname(report_uri.rstrip("/")))  # <root>/ImageExampleGen
    folder = fs.join(component_dir, FAILED_DIR, os.path.basename(report_uri.rstrip("/")))
    path = fs.join(folder, QUARANTINE_FILE)
    io_utils.write_string_file(path, quarantine_csv(bad))
    if summary is not None:
        _write_json({**summary, "quarantine_csv": path}, fs.join(folder, SUMMARY_FILE))
    return path


# Below both, the files are ingested in the executor's own process: worker processes would cost more CPU
# than they save time (measured, small PNG/JPEG digits, 2 cores: 300 files 0.86 s wall inline or with two
# workers, which took 0.37 s more CPU; 800 files 1.62 s inline, 1.44 s with two; 1,797 files 3.02 s, 2.45 s).
INLINE_MAX_FILES = 1000
INLINE_MAX_BYTES = 16 << 20


def local_processes(beam_args: List[str], candidates: List[Candidate]) -> int:
    """Worker processes for InspectAndWrite with the in-memory DirectRunner: --direct_num_workers if given
    (0: one per core), else one per core, or none (1: inline) for a small input. Other runners (Dataflow,
    Beam's multi_processing mode) already run a worker per core, and get 1."""
    options = PipelineOptions(beam_args or [])
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    direct = options.view_as(DirectOptions)
    if runner not in IN_PROCESS_BEAM_RUNNERS or direct.direct_running_mode == "multi_processing":
        return 1
    if any(arg.split("=", 1)[0] == "--direct_num_workers" for arg in beam_args or []):
        return max(1, direct.direct_num_workers or cpu_count())
    if (
        len(candidates) < INLINE_MAX_FILES
        and sum(c.size if c.size >= 0 else INLINE_MAX_BYTES for c in candidates) < INLINE_MAX_BYTES
    ):
        return 1
    return cpu_count()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS)
        return os.cpu_count() or 1


def ingest_order(candidates: List[Candidate], seed: int) -> List[Candidate]:
    """The candidates in an order shuffled with `seed`: each batch, and so each shard and the whole
    split, mixes the classes. In the listing's order (one class folder after another) the examples
    would reach the Trainer a class at a time, which no shuffle buffer smaller than the data undoes.
    Keyed by path, so the same seed gives the same order, and a file added keeps the others' order."""

    def key(c: Candidate) -> bytes:
        return hashlib.sha256(f"{seed}\0{c.rel_path}".encode("utf-8", "surrogateescape")).digest()

    return sorted(candidates, key=key)


def batches(candidates: List[Candidate], processes: int) -> List[List[Candidate]]:
    """About two batches per process, 64 to 2,000 files each: enough work to spread, few shards."""
    size = min(2000, max(64, -(-len(candidates) // (2 * processes))))
    return [candidates[i : i + size] for i in range(0, len(candidates), size)]
