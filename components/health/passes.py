"""DataHealth's passes over Transform's examples and the backbone features: one Beam graph, so Beam's local runner
runs them here and Dataflow runs them with --dataflow.

What leaves the graph is small and bounded: the rows of the images the checks flag (poor or far from every
class), the label check's sample (at most LABEL_CHECK_SAMPLE images: their key, path, split, labels, and features
or pixels at most 32 px a side), and the images a class. Inside it every image streams; what is combined in one
place is the features' moments and each training class's sum (a few vectors a class), each image's distance to
the nearest class centre (4 bytes an image: 40 MB at 10 million images) for the far-out fence, and the keys of
the images past the fence (a few per cent of them), which the pass over the examples gets as a side input.

The features are read three times (moments, distances, the images past the fence) rather than held: a Beam
stage that waited for the fence would keep every image's distance and key in the local runner's memory.
"""

import os
import pickle
from typing import Any, Dict, List, NamedTuple, Optional

import apache_beam as beam
import numpy as np
import tensorflow as tf
from tfx.dsl.io import fileio
from tfx.utils import io_utils

from components.health import checks, label_issues
from components.health.sample import Sample
from images.finding.listing import label_set
from trainer import features as feature_names

EXAMPLE_BATCH = 128  # examples decoded at a time (224 px: 19 MB of pixels, 77 MB as float32)
FEATURE_BATCH = 1024  # feature records parsed at a time (1,280 values: ~5 MB a batch)
FAR_REASON = "far from every class (feature space)"
# What the graph leaves for the executor, in its temporary folder (read once the graph has finished).
ROWS_FILE, SAMPLE_FILE, VECTORS_FILE, COUNTS_FILE = "rows.pickle", "sample.pickle", "vectors.pickle", "counts.pickle"
_ROWS, _SAMPLED, _COUNTS, _VECTORS = "rows", "sampled", "counts", "vectors"


class Gathering(NamedTuple):
    """What the passes gather from each image: decoded as `hp` says, its class among `names`, the label check's
    `sample` (with pixels at most 32 px a side when `keep_pixels`: the cnn's check), single- or multi-label."""

    hp: Any
    names: List[str]
    sample: Sample
    keep_pixels: bool
    multi_label: bool


def build(
    pipeline: beam.Pipeline,
    examples: Dict[str, str],
    features: Optional[Dict[str, Any]],
    gathering: Gathering,
    out_dir: str,
) -> None:
    """The graph. examples: split -> file pattern of Transform's examples; features: None, or {"dim": values an
    image, "views": split -> augmented views a record, "files": split -> file pattern}."""
    sample, multi_label = gathering.sample, gathering.multi_label
    if features is None:
        far = pipeline | "NoFeatures" >> beam.Create([frozenset()])
    else:
        far, sampled_vectors = _feature_passes(pipeline, features, sample, multi_label, far_too=not multi_label)
        _ = (
            sampled_vectors
            | "VectorsList" >> beam.combiners.ToList()
            | "WriteVectors" >> beam.Map(_write, os.path.join(out_dir, VECTORS_FILE))
        )
    outputs = []
    for split, pattern in examples.items():
        outputs.append(
            _batches(pipeline, f"Examples[{split}]", pattern, EXAMPLE_BATCH)
            | f"Examples[{split}]"
            >> beam.ParDo(_Examples(gathering, split), beam.pvalue.AsSingleton(far)).with_outputs(
                _SAMPLED, _COUNTS, main=_ROWS
            )
        )
    for tag, file_name in ((_ROWS, ROWS_FILE), (_SAMPLED, SAMPLE_FILE)):
        _ = (
            [o[tag] for o in outputs]
            | f"Flatten[{tag}]" >> beam.Flatten(pipeline=pipeline)
            | f"List[{tag}]" >> beam.combiners.ToList()
            | f"Write[{tag}]" >> beam.Map(_write, os.path.join(out_dir, file_name))
        )
    _ = (
        [o[_COUNTS] for o in outputs]
        | "FlattenCounts" >> beam.Flatten(pipeline=pipeline)
        | "Counts" >> beam.CombineGlobally(_add_counts)
        | "WriteCounts" >> beam.Map(_write, os.path.join(out_dir, COUNTS_FILE))
    )


def read(out_dir: str) -> Dict[str, Any]:
    """What the graph left: rows, sample, vectors (key -> vector, {} without features), counts."""
    found = {}
    for name, file_name in (
        ("rows", ROWS_FILE),
        ("sample", SAMPLE_FILE),
        ("counts", COUNTS_FILE),
        ("vectors", VECTORS_FILE),
    ):
        path = os.path.join(out_dir, file_name)
        written = name != "vectors" or fileio.exists(path)  # no features: no vectors
        found[name] = pickle.loads(io_utils.read_bytes_file(path)) if written else []
    found["vectors"] = dict(found["vectors"])
    return found


def _write(value, path: str) -> None:
    io_utils.write_bytes_file(path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _batches(pipeline, step: str, pattern: str, size: int):
    """The TFRecord files matching the pattern, spread over the workers a file each, read in batches of `size`
    serialized records (TensorFlow's reader: Beam's reads and decompresses record by record in Python)."""
    return (
        pipeline
        | f"Pattern{step}" >> beam.Create([pattern])
        | f"Files{step}" >> beam.FlatMap(_files)
        | f"Spread{step}" >> beam.Reshuffle()
        | f"Read{step}" >> beam.ParDo(_ReadBatches(size))
    )


def _files(pattern: str) -> List[str]:
    return sorted(fileio.glob(pattern))


class _ReadBatches(beam.DoFn):
    """A TFRecord file -> its records, `size` at a time (a string tensor each)."""

    def __init__(self, size: int):
        self._size = size

    def process(self, path: str):
        records = tf.data.TFRecordDataset([path], compression_type=feature_names.compression([path]))
        yield from records.batch(self._size).prefetch(1)


def _feature_passes(pipeline, features: Dict[str, Any], sample: Sample, multi_label: bool, far_too: bool):
    """(the keys past the far-out fence as a one-element PCollection, the sample's (key, vector) pairs).

    Each split's records go through their step before anything is flattened: Beam's local runner holds all of a
    Flatten's input when its consumer is a stage of its own (500 MB of vectors a pass at 100,000 images)."""

    def each_split(step: str, transform, *side_inputs, outputs=None):
        parts = []
        for split, pattern in features["files"].items():
            parse = _ParseFeatures(features["dim"], features["views"].get(split, 0), split, multi_label)
            applied = beam.ParDo(transform, *side_inputs)
            parts.append(
                _batches(pipeline, f"{step}[{split}]", pattern, FEATURE_BATCH)
                | f"{step}Parse[{split}]" >> beam.ParDo(parse)
                | f"{step}[{split}]" >> (applied.with_outputs(*outputs, main="main") if outputs else applied)
            )
        if outputs:
            return {
                tag: [part[tag] for part in parts] | f"{step}Flatten[{tag}]" >> beam.Flatten(pipeline=pipeline)
                for tag in ("main",) + tuple(outputs)
            }
        return parts | f"{step}Flatten" >> beam.Flatten(pipeline=pipeline)

    if not far_too:
        far = pipeline | "NoFar" >> beam.Create([frozenset()])
        return far, each_split("Sample", _SampledVectors(sample))
    centres = (
        each_split("Moments", _Moments())
        | "AddMoments" >> beam.CombineGlobally(_add_moments)
        | "Centres" >> beam.Map(_centres)
    )
    measured = each_split("Distances", _Distances(sample), beam.pvalue.AsSingleton(centres), outputs=(_VECTORS,))
    fence = measured["main"] | "Fence" >> beam.CombineGlobally(_FenceFn())
    far = each_split(
        "Far", _PastFence(), beam.pvalue.AsSingleton(centres), beam.pvalue.AsSingleton(fence)
    ) | "FarKeys" >> beam.CombineGlobally(_KeySetFn())
    return far, measured[_VECTORS]


class _ParseFeatures(beam.DoFn):
    """A batch of feature records -> (split, keys, labels (class ids; multi-label: None), plain vectors [n, dim])."""

    def __init__(self, dim: int, views: int, split: str, multi_label: bool):
        self._dim, self._views, self._split, self._multi_label = dim, views, split, multi_label

    def setup(self):
        label = {feature_names.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64, default_value=-1)}
        self._spec = {
            feature_names.FEATURES_KEY: tf.io.FixedLenFeature([(self._views + 1) * self._dim], tf.float32),
            feature_names.KEY: tf.io.FixedLenFeature([], tf.string),
            **({} if self._multi_label else label),
        }

    def process(self, batch):
        parsed = tf.io.parse_example(batch, self._spec)
        keys = [k.decode() for k in parsed[feature_names.KEY].numpy()]
        labels = None if self._multi_label else parsed[feature_names.LABEL_KEY].numpy()
        yield self._split, keys, labels, parsed[feature_names.FEATURES_KEY].numpy()[:, : self._dim]


def _sampled_vectors(parsed, sample: Sample):
    _, keys, labels, vectors = parsed
    for i, key in enumerate(keys):
        if sample.keeps(key, None if labels is None else int(labels[i])):
            yield key, vectors[i].astype(np.float32)


class _SampledVectors(beam.DoFn):
    """The label check's sample's (key, vector) pairs."""

    def __init__(self, sample: Sample):
        self._sample = sample

    def process(self, parsed):
        yield from _sampled_vectors(parsed, self._sample)


class _Moments(beam.DoFn):
    def process(self, parsed):
        yield _moments(parsed)


def _moments(parsed):
    """One batch's count, sums and sums of squares of the features, and each training class's (sum, count)."""
    split, _, labels, vectors = parsed
    wide = vectors.astype(np.float64)
    classes = {}
    if split == "train":
        for c in np.unique(labels):
            if c >= 0:
                rows = wide[labels == c]
                classes[int(c)] = (rows.sum(axis=0), len(rows))
    return len(wide), wide.sum(axis=0), (wide**2).sum(axis=0), classes


def _add_moments(parts):
    count, total, squares, classes = 0, 0.0, 0.0, {}
    for n, t, s, cs in parts:
        count, total, squares = count + n, total + t, squares + s
        for c, (class_sum, class_count) in cs.items():
            before = classes.get(c, (0.0, 0))
            classes[c] = (before[0] + class_sum, before[1] + class_count)
    return count, total, squares, classes


def _centres(moments):
    """(mean, scale, centres [classes, dim]) in standardised features; None: too few to standardise."""
    count, total, squares, classes = moments
    if count <= 2 or not classes:
        return None
    mean = total / count
    scale = np.sqrt(np.maximum(squares / count - mean**2, 0.0)) + 1e-6
    centres = np.stack([(classes[c][0] / classes[c][1] - mean) / scale for c in sorted(classes)]).astype(np.float32)
    return mean, scale, centres


def _distances(vectors: np.ndarray, centres) -> np.ndarray:
    mean, scale, points = centres
    return checks.nearest_centre(((vectors - mean) / scale).astype(np.float32), points)


class _Distances(beam.DoFn):
    """Each batch's distances to the nearest class centre (an array: 4 bytes an image); the sample's vectors."""

    def __init__(self, sample: Sample):
        self._sample = sample

    def process(self, parsed, centres):
        yield from (beam.pvalue.TaggedOutput(_VECTORS, pair) for pair in _sampled_vectors(parsed, self._sample))
        if centres is not None:
            yield _distances(parsed[3], centres)


class _FenceFn(beam.CombineFn):
    """The far-out fence of every image's distance (checks.fence): the distances, 4 bytes an image."""

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, distances):
        accumulator.append(np.asarray(distances, np.float32))
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = [np.concatenate([a for part in accumulators for a in part] or [np.zeros(0, np.float32)])]
        return merged

    def extract_output(self, accumulator):
        return checks.fence(np.concatenate(accumulator)) if accumulator else None


class _PastFence(beam.DoFn):
    """The keys of the images past the far-out fence."""

    def process(self, parsed, centres, fence: Optional[float]):
        if centres is None or fence is None:
            return
        _, keys, _, vectors = parsed
        distances = _distances(vectors, centres)
        yield from (key for key, d in zip(keys, distances) if d > fence)


class _KeySetFn(beam.CombineFn):
    """The keys, as one frozenset."""

    def create_accumulator(self):
        return set()

    def add_input(self, accumulator, key):
        accumulator.add(key)
        return accumulator

    def merge_accumulators(self, accumulators):
        return set().union(*accumulators)

    def extract_output(self, accumulator):
        return frozenset(accumulator)


class _Examples(beam.DoFn):
    """A batch of Transform's examples -> the rows of its flagged images (main output), its sampled images (key,
    path, split, labels, pixels at most 32 px a side for the cnn check or None), and its images a class."""

    def __init__(self, gathering: Gathering, split: str):
        self._hp, self._names, self._sample, self._split = gathering.hp, gathering.names, gathering.sample, split
        self._keep_pixels, self._multi_label = gathering.keep_pixels, gathering.multi_label

    def setup(self):
        self._spec = {
            feature_names.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string),
            **feature_names.label_spec(self._multi_label),
            feature_names.KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
            feature_names.FILENAME_KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
            "original_height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
            "original_width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
        }

    def process(self, batch, far: frozenset):
        hp = self._hp
        parsed = tf.io.parse_example(batch, self._spec)
        pixels = feature_names.decode_pixels(parsed[feature_names.PIXELS_KEY], hp.image_size, hp.channels)
        gray = tf.reduce_mean(pixels, axis=-1)
        means, stds = tf.reduce_mean(gray, axis=[1, 2]).numpy(), tf.math.reduce_std(gray, axis=[1, 2]).numpy()
        labels = (
            tf.RaggedTensor.from_sparse(parsed[feature_names.LABELS_KEY]).to_list()
            if self._multi_label
            else [int(n) for n in parsed[feature_names.LABEL_KEY].numpy()]
        )
        keys = [k.decode() for k in parsed[feature_names.KEY].numpy()]
        paths = [p.decode("utf-8", "replace") for p in parsed[feature_names.FILENAME_KEY].numpy()]
        heights, widths = parsed["original_height"].numpy(), parsed["original_width"].numpy()
        kept, counts = [], {}
        for i, key in enumerate(keys):
            counts_key = None if self._multi_label else labels[i]
            counts[counts_key] = counts.get(counts_key, 0) + 1
            if self._sample.keeps(key, counts_key):
                kept.append(i)
            reasons = checks.poor_image_reasons(float(means[i]), float(stds[i]), int(heights[i]), int(widths[i]))
            if key in far:
                reasons.append(FAR_REASON)
            if reasons:
                yield {
                    "path": paths[i],
                    "split": self._split,
                    "label": self._label_text(labels[i]),
                    "reasons": "; ".join(reasons),
                    "key": key,
                }
        small = None
        if self._keep_pixels and kept:  # for the cnn label check, at most CNN_MAX_SIZE a side
            small = tf.gather(pixels, kept)
            if hp.image_size > label_issues.CNN_MAX_SIZE:
                small = tf.image.resize(small, [label_issues.CNN_MAX_SIZE] * 2, antialias=True)
            small = np.clip(small.numpy(), 0, 255).astype(np.uint8)
        for j, i in enumerate(kept):
            yield beam.pvalue.TaggedOutput(
                _SAMPLED, (keys[i], paths[i], self._split, labels[i], None if small is None else small[j])
            )
        yield beam.pvalue.TaggedOutput(_COUNTS, counts)

    def _label_text(self, label) -> str:
        if self._multi_label:
            return label_set(self._names[c] for c in label if 0 <= c < len(self._names))
        return self._names[label] if 0 <= label < len(self._names) else ""


def _add_counts(parts) -> Dict[Any, int]:
    total: Dict[Any, int] = {}
    for part in parts:
        for label, n in part.items():
            total[label] = total.get(label, 0) + n
    return total
