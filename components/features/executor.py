"""Beam executor of BackboneFeatures: Transform's pixel records -> pooled backbone features, once per image.

Per split:

  transformed records --BatchElements (by bytes)--> ComputeFeatures --> Split-<split>/features-*.tfrecord

ComputeFeatures keys each image by the SHA-256 of its pixels, takes the features the cache has, runs
the backbone on the rest (in calls of MODEL_BATCH images) and caches them (a pack a batch). A worker process loads the
run's backbone (backbone.prepare() stored it in the cache as a frozen graph) once for all splits
(shared_extractor), at its first image the cache lacks, so a rerun on cached images loads none. With
--augment, the train split also gets hp.augment_views augmented views of each image (trainer/input_pipeline.py
augment_views, seeded by the image's key and the view), cached the same way. Each output example
holds `features` (views x dim floats: the plain image first), `label` and `key`.

The artifact also holds `source.json`: the Transform output the pixels came from (the Trainer's
fine-tune phase and TFLite export read pixels there), the backbone's weights (a copy of the cache's, in the
artifact: `backbone.weights.h5`), the dimension and the views; and `summary.json`: images, features reused and
computed, seconds (and the seconds spent in the backbone and in cache reads and writes).
"""

import collections
import hashlib
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, NamedTuple

import apache_beam as beam
import numpy as np
import tensorflow as tf
from absl import logging
from apache_beam.transforms.window import GlobalWindows
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components import beam_settings
from components.beam_dependencies import NoTfxPackageForLocalRunners
from components.features import SUMMARY_FILE, backbone, feature_cache
from images import example_codec
from storage.progress_events import progress_event
from trainer import features, input_pipeline
from trainer.artifact_files import FEATURE_PROFILE_FILE, FEATURES_SOURCE_FILE, FEATURES_WEIGHTS_FILE
from trainer.hparams import HParams

# Pixel records per Beam batch (870 images at 160 px; 21 at 1,024). When most images are cached, the ones
# that are not are scattered: a larger batch gathers more of them into each backbone call (a second span at
# 8,000 images: 16 MB batches called the backbone on ~20 images at a time, at 100 images/s).
BATCH_BYTES = 64 << 20
# Images per backbone call: measured on 2 CPU cores, MobileNetV2 at 160 px, 32 a call ran at 244 images/s,
# 64 at 230; the call's fixed cost is small by then. Every call but the last of a batch has this size.
MODEL_BATCH = 32
INPUT_KEY, OUTPUT_KEY = "transformed_examples", "features"
HPARAMS_KEY, CACHE_KEY = "hparams", "cache_dir"
COUNTERS = ("images", "reused", "computed")
# Where the step's time goes, in milliseconds (summed over workers): summary.json has them in seconds.
TIMERS = ("backbone_ms", "cache_read_ms", "cache_write_ms")
MOMENTS = "moments"  # the DoFn's side output: (count, sum, sum of squares) of the plain vectors of a batch


class _Batch(NamedTuple):
    """A batch of records on its way through ComputeFeatures: read and looked up, computing, done."""

    labels: Any  # int64 [n], or multi-label: a list of ids per record
    hashes: Any  # the images' content hashes (the `key` feature) [n]
    out: Any  # float32 [n, views + 1, dim]: filled from the cache, then by the backbone
    computing: Any  # the backbone thread's future: (backbone ms, cache write ms)


class ComputeFeatures(beam.DoFn):
    """Pixel records -> feature examples, through the cache.

    The backbone runs in a thread of its own (as do the cache writes): while it works on one batch, Beam
    reads, parses and hashes the next one, and the examples of the batch before are written. On 2 cores
    the backbone alone kept them about two-thirds busy. At most IN_FLIGHT batches wait on it; the rest of
    a bundle is finished in finish_bundle.
    """

    IN_FLIGHT = 2

    def __init__(self, hp: HParams, prepared: backbone.Prepared, cache_root: str, views: int, run: str = ""):
        self._hp, self._prepared, self._root, self._views = hp, prepared, cache_root, views
        self._run = run  # the executor's run: its splits' DoFns in one process share the cache's index
        self._counters = {name: beam.metrics.Metrics.counter("BackboneFeatures", name) for name in COUNTERS + TIMERS}

    def setup(self):
        self._cache = shared_cache(self._run, self._root, self._prepared)
        self._augment_id = hashlib.sha256(self._hp.augment.encode()).hexdigest()[:8]
        self._backbone_thread = ThreadPoolExecutor(1)
        self._writer = ThreadPoolExecutor(1)
        self._done = 0
        self._multi_label = None  # known from the first record (every record of a run is of one task)

    def teardown(self):
        for pool in (getattr(self, "_backbone_thread", None), getattr(self, "_writer", None)):
            if pool is not None:
                pool.shutdown()
        if getattr(self, "_cache", None) is not None:  # (not when its setup failed)
            release_cache(self._run)
            self._cache = None

    def start_bundle(self):
        self._pending = collections.deque()

    def process(self, records: List[bytes]):
        if not records:
            return
        hp, dim = self._hp, self._prepared.dim
        # Multi-label records carry their labels' ids (features.LABELS_KEY), which go through as they are.
        if self._multi_label is None:
            self._multi_label = features.LABELS_KEY in tf.train.Example.FromString(records[0]).features.feature
        multi_label = self._multi_label
        parsed = tf.io.parse_example(
            tf.constant(records, tf.string),
            {
                features.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string),
                **features.label_spec(multi_label),
                features.KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
            },
        )
        labels = (
            tf.RaggedTensor.from_sparse(parsed[features.LABELS_KEY]).to_list()
            if multi_label
            else parsed[features.LABEL_KEY].numpy()
        )
        # A serialized uint8 tensor ends with its pixel bytes (trainer/features.py decode_pixels).
        count = hp.image_size * hp.image_size * hp.channels
        raw = [memoryview(b)[-count:] for b in parsed[features.PIXELS_KEY].numpy()]
        keys = [hashlib.sha256(p).hexdigest() for p in raw]
        out = np.zeros((len(records), self._views + 1, dim), np.float32)
        missing = []  # per view: (the images the cache lacks, their entry names)
        started = time.perf_counter()
        views = [
            [k if view == 0 else f"{k}.aug-{self._augment_id}-{view}" for k in keys] for view in range(self._views + 1)
        ]
        # One lookup for every view: a batch's views share its packs, read in one ranged request each.
        cached = self._cache.get_many([name for names in views for name in names])
        for view, names in enumerate(views):
            lacking = []
            for i, vector in enumerate(cached[view * len(keys) : (view + 1) * len(keys)]):
                if vector is None:
                    lacking.append(i)
                else:
                    out[i, view] = vector
            missing.append((lacking, [names[i] for i in lacking]))
            self._counters["computed"].inc(len(lacking))
            self._counters["reused"].inc(len(names) - len(lacking))
        self._timed("cache_read_ms", started)
        computing = (
            self._backbone_thread.submit(self._compute, raw, keys, missing, out)
            if any(lacking for lacking, _ in missing)
            else None
        )
        self._pending.append(_Batch(labels, parsed[features.KEY].numpy(), out, computing))
        while len(self._pending) > self.IN_FLIGHT or (self._pending and self._pending[0].computing is None):
            yield from self._finished(self._pending.popleft())

    def finish_bundle(self):
        while self._pending:
            for item in self._finished(self._pending.popleft()):
                if isinstance(item, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(item.tag, GlobalWindows.windowed_value(item.value))
                else:
                    yield GlobalWindows.windowed_value(item)

    def _compute(self, raw, keys: List[str], missing, out):
        """In the backbone thread: the features of the images the cache lacks, into `out`, and cached.
        `raw`: each image's pixel bytes (stacked into arrays only for the images computed: most of a new
        span's are cached). Returns (backbone ms, cache write ms); Beam's counters count only in the DoFn's
        own thread."""
        names_done, vectors_done, size, started = [], [], self._hp.image_size, time.perf_counter()
        # Made at the first batch with an image the cache lacks (only such batches come here): a rerun on
        # cached images makes no backbone at all. Its making counts as backbone time.
        extract = shared_extractor(self._hp, self._prepared)
        spent = time.perf_counter() - started
        for view, (lacking, names) in enumerate(missing):
            for start in range(0, len(lacking), MODEL_BATCH):
                chosen = lacking[start : start + MODEL_BATCH]
                started = time.perf_counter()
                pixels = np.frombuffer(b"".join(raw[i] for i in chosen), np.uint8).reshape(
                    len(chosen), size, size, self._hp.channels
                )
                if view:
                    seeds = tf.constant(
                        [[int(keys[i][:8], 16), int(keys[i][8:16], 16) + view] for i in chosen], tf.int64
                    )
                    pixels = input_pipeline.augment_views(tf.cast(pixels, tf.float32), self._hp, seeds).numpy()
                out[chosen, view] = extract(pixels)
                spent += time.perf_counter() - started
                names_done += names[start : start + MODEL_BATCH]
                vectors_done.append(np.array(out[chosen, view]))
        # The batch's features as one pack (feature_cache.py); a failed write fails the step.
        return int(spent * 1000), self._writer.submit(self._put, names_done, np.concatenate(vectors_done)).result()

    def _put(self, names: List[str], vectors) -> int:
        started = time.perf_counter()
        self._cache.put_many(names, vectors)
        return int((time.perf_counter() - started) * 1000)

    def _timed(self, timer: str, started: float) -> None:
        self._counters[timer].inc(int((time.perf_counter() - started) * 1000))

    def _finished(self, batch: _Batch):
        """The batch's outputs, once the backbone is done with it: its examples, and its moments."""

        if batch.computing is not None:
            backbone_ms, write_ms = batch.computing.result()
            self._counters["backbone_ms"].inc(backbone_ms)
            self._counters["cache_write_ms"].inc(write_ms)
        self._counters["images"].inc(len(batch.out))
        self._done += len(batch.out)
        progress_event("features", self._done, 0)  # for `imagepipe run`; the total is not known here
        plain = batch.out[:, 0].astype(np.float64)  # for the profile of the data (feature drift, data health)
        yield beam.pvalue.TaggedOutput(MOMENTS, (len(plain), plain.sum(axis=0), (plain**2).sum(axis=0)))
        for vector, label, key in zip(batch.out, batch.labels, batch.hashes):
            yield feature_example(vector, label if isinstance(label, list) else int(label), key)


_CACHES: Dict[str, list] = {}  # run -> [its FeatureCache, the DoFns using it]
_CACHES_LOCK = threading.Lock()


def shared_cache(run: str, root: str, prepared: backbone.Prepared) -> feature_cache.FeatureCache:
    """The run's cache in this process: its index of the packs' keys is read once for every split."""
    with _CACHES_LOCK:
        entry = _CACHES.setdefault(run, [feature_cache.FeatureCache(root, prepared.fingerprint, prepared.dim), 0])
        entry[1] += 1
        return entry[0]


def release_cache(run: str) -> None:
    with _CACHES_LOCK:
        entry = _CACHES.get(run)
        if entry is None:  # a teardown after a setup that failed
            return
        entry[1] -= 1
        if not entry[1]:
            entry[0].close()
            del _CACHES[run]


_SHARED = {"key": None, "extractor": None}  # the last backbone made in this process (one at a time: it is large)
_SHARED_LOCK = threading.Lock()


def shared_extractor(hp: HParams, prepared: backbone.Prepared):
    """Pixels (uint8 or float32) -> features for the prepared backbone, loaded once per process from its frozen graph
    in the cache (~0.5 s, and ~1 s to convert it for ONNX Runtime; backbone.load_extractor): every split's DoFn (and
    every bundle's) uses the same."""
    with _SHARED_LOCK:  # the fingerprint covers the model, input size and channels; the files are its own
        if _SHARED["key"] != prepared:
            _SHARED["key"], _SHARED["extractor"] = None, None  # the old one is freed before the new one is made
            _SHARED["extractor"] = backbone.load_extractor(hp, prepared)
            logging.info("BackboneFeatures: the backbone runs on %s", _SHARED["extractor"].runtime)
            _SHARED["key"] = prepared
        return _SHARED["extractor"]


def release_shared_extractor() -> None:
    with _SHARED_LOCK:
        _SHARED["key"], _SHARED["extractor"] = None, None


def feature_example(vector, label, key: bytes) -> bytes:
    """The serialized tf.train.Example {features: FloatList, label: Int64List, key: BytesList} (a multi-label
    record's label: the list of its ids, as `labels`), by ingestion's
    TF-free encoder: tf.train.FloatList(value=vector) converts every float one at a time, 1.2 s of the 8 s a
    rerun on 8,000 cached images took (tests/test_backbone_features.py checks the bytes parse back)."""
    label_key = features.LABELS_KEY if isinstance(label, list) else features.LABEL_KEY
    return example_codec.encode_example({features.FEATURES_KEY: vector, label_key: label, features.KEY: key})


class Executor(NoTfxPackageForLocalRunners, base_beam_executor.BaseBeamExecutor):
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        beam_settings.configure_beam()  # fast TFRecord checksums
        source = artifact_utils.get_single_instance(input_dict[INPUT_KEY])
        output = artifact_utils.get_single_instance(output_dict[OUTPUT_KEY])
        hp = HParams.from_custom_config(json.loads(exec_properties[HPARAMS_KEY]))
        cache_root = exec_properties[CACHE_KEY]
        splits = artifact_utils.decode_split_names(source.split_names)
        output.split_names = artifact_utils.encode_split_names(splits)
        started = time.monotonic()
        prepared = backbone.prepare(hp, cache_root)
        views = {split: hp.augment_views if split == "train" and hp.augmentations else 0 for split in splits}
        logging.info(
            "BackboneFeatures: %s at %d px, %d features an image, cache %s (fingerprint %s), views %s",
            hp.model,
            hp.image_size,
            prepared.dim,
            cache_root,
            prepared.fingerprint,
            views,
        )
        pipeline = self._make_beam_pipeline()
        run = uuid.uuid4().hex  # its splits share one index of the cache (shared_cache)
        for split in splits:
            compute = ComputeFeatures(hp, prepared, cache_root, views[split], run)
            _add_split_stages(pipeline, split, source, output, compute)
        try:
            result = pipeline.run()
            result.wait_until_finish()
        finally:
            release_shared_extractor()  # in-process workers are done: the Trainer's process needs the memory
        counts = {name: _counter(result, name) for name in COUNTERS}
        spent = {name[:-3] + "_seconds": round(_counter(result, name) / 1000, 2) for name in TIMERS}
        _write_features_source(output, source, prepared, views)
        summary = {
            **counts,
            "fingerprint": prepared.fingerprint,
            "dim": prepared.dim,
            "views": views,
            "cache": cache_root,
            "seconds": round(time.monotonic() - started, 2),
            **spent,
        }
        io_utils.write_string_file(os.path.join(output.uri, SUMMARY_FILE), json.dumps(summary, indent=1))
        for name in COUNTERS:
            output.set_int_custom_property(name, counts[name])
        logging.info("BackboneFeatures: %s", summary)


def _add_split_stages(pipeline, split: str, source, output, compute: "ComputeFeatures") -> None:
    """A split's stages: its examples read, batched, through the backbone (`compute`) and written; train's moments
    profiled."""
    computed = (
        pipeline
        | f"Read[{split}]"
        >> beam.io.ReadFromTFRecord(
            io_utils.all_files_pattern(artifact_utils.get_split_uri([source], split)), coder=beam.coders.BytesCoder()
        )
        # Fixed-size batches by bytes (Beam's adaptive sizes start at one image, and each backbone
        # call has a fixed cost): thousands of thumbnails a batch, a handful of photos.
        | f"Batch[{split}]"
        >> beam.BatchElements(min_batch_size=BATCH_BYTES, max_batch_size=BATCH_BYTES, element_size_fn=len)
        | f"Features[{split}]" >> beam.ParDo(compute).with_outputs(MOMENTS, main="examples")
    )
    _ = (
        computed.examples
        | f"Write[{split}]"
        >> beam.io.WriteToTFRecord(  # uncompressed (trainer/features.py compression)
            os.path.join(artifact_utils.get_split_uri([output], split), "features"),
            file_name_suffix=".tfrecord",
            coder=beam.coders.BytesCoder(),
        )
    )
    if split == "train":
        _ = (
            computed[MOMENTS]
            | "Moments" >> beam.CombineGlobally(_add_moments)
            | "Profile" >> beam.Map(_write_profile, os.path.join(output.uri, FEATURE_PROFILE_FILE))
        )


def _write_features_source(output, source, prepared, views) -> None:
    """What the Trainer reads to train on these features (trainer/training.py features_source), and the backbone's
    weights beside it (a copy: nothing in the artifact points into the cache, which may be cleared)."""
    weights = os.path.join(output.uri, FEATURES_WEIGHTS_FILE)
    io_utils.copy_file(prepared.weights_file, weights, overwrite=True)
    io_utils.write_string_file(
        os.path.join(output.uri, FEATURES_SOURCE_FILE),
        json.dumps(
            {
                "transformed_examples": source.uri,
                "backbone_weights": weights,
                "fingerprint": prepared.fingerprint,
                "dim": prepared.dim,
                "views": views,
            },
            indent=1,
        ),
    )


def _add_moments(parts):
    parts = list(parts)
    if not parts:
        return None
    return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)


def _write_profile(moments, path: str) -> None:
    """feature_profile.json: the mean and standard deviation of each feature over the training split."""

    if moments is None:
        return
    count, total, squares = moments
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    io_utils.write_string_file(
        path, json.dumps({"count": int(count), "mean": mean.round(6).tolist(), "std": std.round(6).tolist()})
    )


def _counter(result, name: str) -> int:
    query = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("BackboneFeatures").with_name(name))
    return int(sum(c.committed or c.attempted or 0 for c in query["counters"]))
