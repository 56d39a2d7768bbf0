"""Beam executor of BackboneFeatures: Transform's pixel records -> pooled backbone features, once per image.

Per split:

  transformed records --BatchElements (by bytes)--> ComputeFeatures --> Split-<split>/features-*.gz

ComputeFeatures keys each image by the SHA-256 of its pixels, takes the features the cache has, runs
the backbone on the rest (in calls of MODEL_BATCH images) and caches them. A worker loads the run's
backbone (backbone.prepare() stored its weights in the cache) at its first image the cache lacks, so a
rerun on cached images makes none. With --augment, the
train split also gets hp.augment_views augmented views of each image (trainer/input_pipeline.py
augment_views, seeded by the image's key and the view), cached the same way. Each output example
holds `features` (views x dim floats: the plain image first), `label` and `key`.

The artifact also holds `source.json`: the Transform output the pixels came from (the Trainer's
fine-tune phase and TFLite export read pixels there), the backbone's weights file in the cache, the
dimension and the views; and `summary.json`: images, features reused and computed, seconds (and the
seconds spent in the backbone and in cache reads and writes).
"""

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import apache_beam as beam
from absl import logging
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components import beam_tuning
from components.backbone_features import PROFILE_FILE, SOURCE_FILE, SUMMARY_FILE, backbone, feature_cache
from components.progress_events import progress_event
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


class ComputeFeatures(beam.DoFn):
    def __init__(self, hp: HParams, prepared: backbone.Prepared, cache_root: str, views: int):
        self._hp, self._prepared, self._root, self._views = hp, prepared, cache_root, views
        self._counters = {name: beam.metrics.Metrics.counter("BackboneFeatures", name) for name in COUNTERS + TIMERS}

    def setup(self):
        self._cache = feature_cache.FeatureCache(self._root, self._prepared.fingerprint, self._prepared.dim)
        self._augment_id = hashlib.sha256(self._hp.augment.encode()).hexdigest()[:8]
        self._extract = None  # made at the first image the cache lacks: a rerun may need no backbone at all
        self._writer = ThreadPoolExecutor(1)
        self._done = 0

    def teardown(self):
        self._writer.shutdown()

    def _extractor(self):
        """(uint8 pixels -> features, float32 pixels -> features): the backbone in the weights the cache holds."""
        if self._extract is None:
            import tensorflow as tf

            from trainer import models

            hp = self._hp
            model = models.feature_extractor(hp, models.make_backbone(hp, self._prepared.weights_file))
            shape = [None, hp.image_size, hp.image_size, hp.channels]
            # uint8 in: a quarter of the bytes to hand over, cast to the float32 the model takes in the graph.
            self._extract = (
                tf.function(lambda images: model(tf.cast(images, tf.float32), training=False),
                            input_signature=[tf.TensorSpec(shape, tf.uint8)]),
                tf.function(lambda images: model(images, training=False), input_signature=[tf.TensorSpec(shape, tf.float32)]))
        return self._extract

    def _put(self, keys: List[str], vectors) -> int:
        """Writes entries (in the writer thread); returns its milliseconds, counted by the DoFn's thread
        (Beam's counters count only there)."""
        started = time.perf_counter()
        self._cache.put_many(keys, vectors)
        return int((time.perf_counter() - started) * 1000)

    def _timed(self, timer: str, started: float) -> None:
        self._counters[timer].inc(int((time.perf_counter() - started) * 1000))

    def process(self, records: List[bytes]):
        import numpy as np
        import tensorflow as tf

        from trainer import features, input_pipeline

        if not records:
            return
        hp, dim = self._hp, self._prepared.dim
        parsed = tf.io.parse_example(tf.constant(records, tf.string), {
            features.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string),
            features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
            features.KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
        })
        # A serialized uint8 tensor ends with its pixel bytes (trainer/features.py decode_pixels).
        count = hp.image_size * hp.image_size * hp.channels
        raw = [memoryview(b)[-count:] for b in parsed[features.PIXELS_KEY].numpy()]
        keys = [hashlib.sha256(p).hexdigest() for p in raw]
        pixels = np.frombuffer(b"".join(raw), np.uint8).reshape(len(raw), hp.image_size, hp.image_size, hp.channels)
        out = np.zeros((len(records), self._views + 1, dim), np.float32)
        writes = []
        for view in range(self._views + 1):
            names = [k if view == 0 else f"{k}.aug-{self._augment_id}-{view}" for k in keys]
            started = time.perf_counter()
            missing = []
            for i, cached in enumerate(self._cache.get_many(names)):
                if cached is None:
                    missing.append(i)
                else:
                    out[i, view] = cached
            self._timed("cache_read_ms", started)
            for start in range(0, len(missing), MODEL_BATCH):
                chosen = missing[start:start + MODEL_BATCH]
                started = time.perf_counter()
                plain, views = self._extractor()
                if view:
                    seeds = tf.constant([[int(keys[i][:8], 16), int(keys[i][8:16], 16) + view] for i in chosen],
                                        tf.int64)
                    vectors = views(input_pipeline.augment_views(tf.cast(pixels[chosen], tf.float32), hp, seeds))
                else:
                    vectors = plain(pixels[chosen])
                out[chosen, view] = vectors.numpy()
                self._timed("backbone_ms", started)
                # Written by another thread while the backbone runs on the next images (waited for below).
                writes.append(self._writer.submit(self._put, [names[i] for i in chosen], out[chosen, view]))
            self._counters["computed"].inc(len(missing))
            self._counters["reused"].inc(len(names) - len(missing))
        for write in writes:  # a failed write fails the step, as a failed read of the input would
            self._counters["cache_write_ms"].inc(write.result())
        self._counters["images"].inc(len(records))
        self._done += len(records)
        progress_event("features", self._done, 0)  # for `imagepipe run`; the total is not known here
        plain = out[:, 0].astype(np.float64)  # for the profile of the data (feature drift, components/data_health)
        yield beam.pvalue.TaggedOutput(MOMENTS, (len(records), plain.sum(axis=0), (plain ** 2).sum(axis=0)))
        labels, hashes = parsed[features.LABEL_KEY].numpy(), parsed[features.KEY].numpy()
        for vector, label, key in zip(out, labels, hashes):
            yield tf.train.Example(features=tf.train.Features(feature={
                features.FEATURES_KEY: tf.train.Feature(float_list=tf.train.FloatList(value=vector.ravel())),
                features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                features.KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[key])),
            })).SerializeToString()


class Executor(base_beam_executor.BaseBeamExecutor):
    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        beam_tuning.tune()  # fast TFRecord checksums
        source = artifact_utils.get_single_instance(input_dict[INPUT_KEY])
        output = artifact_utils.get_single_instance(output_dict[OUTPUT_KEY])
        hp = HParams.from_custom_config(json.loads(exec_properties[HPARAMS_KEY]))
        cache_root = exec_properties[CACHE_KEY]
        splits = artifact_utils.decode_split_names(source.split_names)
        output.split_names = artifact_utils.encode_split_names(splits)
        started = time.monotonic()
        prepared = backbone.prepare(hp, cache_root)
        views = {split: hp.augment_views if split == "train" and hp.augmentations else 0 for split in splits}
        logging.info("BackboneFeatures: %s at %d px, %d features an image, cache %s (fingerprint %s), views %s",
                     hp.model, hp.image_size, prepared.dim, cache_root, prepared.fingerprint, views)
        pipeline = self._make_beam_pipeline()
        profile_path = os.path.join(output.uri, PROFILE_FILE)
        for split in splits:
            computed = (pipeline
                        | f"Read[{split}]" >> beam.io.ReadFromTFRecord(
                            io_utils.all_files_pattern(artifact_utils.get_split_uri([source], split)),
                            coder=beam.coders.BytesCoder())
                        # Fixed-size batches by bytes (Beam's adaptive sizes start at one image, and each backbone
                        # call has a fixed cost): thousands of thumbnails a batch, a handful of photos.
                        | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=BATCH_BYTES,
                                                                  max_batch_size=BATCH_BYTES, element_size_fn=len)
                        | f"Features[{split}]" >> beam.ParDo(ComputeFeatures(hp, prepared, cache_root, views[split]))
                        .with_outputs(MOMENTS, main="examples"))
            _ = (computed.examples
                 | f"Write[{split}]" >> beam.io.WriteToTFRecord(
                     os.path.join(artifact_utils.get_split_uri([output], split), "features"),
                     file_name_suffix=".gz", coder=beam.coders.BytesCoder()))
            if split == "train":
                _ = (computed[MOMENTS]
                     | "Moments" >> beam.CombineGlobally(_add_moments)
                     | "Profile" >> beam.Map(_write_profile, profile_path))
        result = pipeline.run()
        result.wait_until_finish()
        counts = {name: _counter(result, name) for name in COUNTERS}
        spent = {name[:-3] + "_seconds": round(_counter(result, name) / 1000, 2) for name in TIMERS}
        io_utils.write_string_file(os.path.join(output.uri, SOURCE_FILE), json.dumps({
            "transformed_examples": source.uri, "backbone_weights": prepared.weights_file,
            "fingerprint": prepared.fingerprint, "dim": prepared.dim, "views": views}, indent=1))
        summary = {**counts, "fingerprint": prepared.fingerprint, "dim": prepared.dim, "views": views,
                   "cache": cache_root, "seconds": round(time.monotonic() - started, 2), **spent}
        io_utils.write_string_file(os.path.join(output.uri, SUMMARY_FILE), json.dumps(summary, indent=1))
        for name in COUNTERS:
            output.set_int_custom_property(name, counts[name])
        logging.info("BackboneFeatures: %s", summary)


def _add_moments(parts):
    parts = list(parts)
    if not parts:
        return None
    return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)


def _write_profile(moments, path: str) -> None:
    """feature_profile.json: the mean and standard deviation of each feature over the training split."""
    import numpy as np

    if moments is None:
        return
    count, total, squares = moments
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean ** 2, 0.0))
    io_utils.write_string_file(path, json.dumps({"count": int(count), "mean": mean.round(6).tolist(),
                                                 "std": std.round(6).tolist()}))


def _counter(result, name: str) -> int:
    query = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("BackboneFeatures").with_name(name))
    return int(sum(c.committed or c.attempted or 0 for c in query["counters"]))
