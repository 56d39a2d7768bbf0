"""The held-out part of the train split: what the Trainer and the Tuner validate on, so that the eval split is seen
once, by the Evaluator.

Everything the Trainer chooses is measured here, never on eval: early stopping and the kept epoch, the Tuner's
objective, the operating point and the calibration (trainer/operating_point.py), the exports' scores. Choosing
them on the split that then grades the model makes the figure a team reads optimistic, most of all for rare classes.

Which train examples are held out is decided by a hash of the image's content key (image/key/sha256, passed through
Transform and the features step; a record without one: its bytes) and the seed, so that:
  - the pixels (Transform's records) and the cached features (the features step's) hold out the same images, and
    copies of one file fall on the same side;
  - it is stratified exactly: each class holds out SHARE of its images (at least one of a class of two or more, and
    never all), the ones with the smallest hashes. A multi-label split holds out SHARE of its images.
Choosing reads the labels and keys once (16 bytes an image in memory); each dataset then keeps its part with a
filter on the records, before they are cached.
"""

import json
from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np
import tensorflow as tf

from trainer import features

SHARE = 0.2  # of each class's train images (sklearn's and Keras' usual validation_split)
HASH_RANGE = 2**62  # hashes are in 0 .. HASH_RANGE - 1
READ_BATCH = 1024
KEEP_BATCH = 256  # records a part's filter judges at once


class Holdout(NamedTuple):
    """Which train examples are held out: those of class c whose hash is below thresholds[c] (multi-label: one
    threshold for all), with the seed mixed into the hash; and the counts on each side."""

    thresholds: Tuple[int, ...]
    seed: int
    multi_label: bool
    train_counts: Tuple[int, ...]  # per class id (multi-label: the training images each label applies to)
    held_counts: Tuple[int, ...]
    train_examples: int
    held_examples: int

    @property
    def empty(self) -> bool:
        """Nothing could be held out (no class has two train images): validation then reads the training part."""
        return self.held_examples == 0

    def to_json(self) -> str:
        return json.dumps(self._asdict())

    @classmethod
    def from_json(cls, text: str) -> "Holdout":
        values = json.loads(text)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def record(self, class_names: Sequence[str]) -> Dict:
        """What training.json says of it."""
        return {
            "share": SHARE,
            "train_examples": self.train_examples,
            "held_out_examples": self.held_examples,
            "held_out_counts": dict(zip(class_names, self.held_counts)),
            "validated_on": "the training part (too few images to hold any out)" if self.empty else "held-out train",
        }


def held_count(n: int, share: float = SHARE) -> int:
    """How many of a class's n train images are held out: its share, rounded, at least one of two or more, and
    never all of them."""
    if n < 2:
        return 0
    return min(n - 1, max(1, int(round(share * n))))


def _hashes(keys: tf.Tensor, records: tf.Tensor, seed: int) -> tf.Tensor:
    """int64 in 0 .. HASH_RANGE - 1: FarmHash of the content key (or the record, without one) and the seed."""
    named = tf.where(tf.strings.length(keys) > 0, keys, records)
    return tf.strings.to_hash_bucket_fast(tf.strings.join([named, tf.constant(f"/holdout/{seed}")]), HASH_RANGE)


def _key_and_label_spec(multi_label: bool) -> dict:
    return {features.KEY: tf.io.FixedLenFeature([], tf.string, default_value=""), **features.label_spec(multi_label)}


def choose(file_patterns: List[str], num_classes: int, multi_label: bool, seed: int) -> Holdout:
    """One pass over these train records (Transform's or the features step's), keys and labels only."""
    files = features.list_files(file_patterns)
    batches = (
        tf.data.TFRecordDataset(files, compression_type=features.compression(files), num_parallel_reads=8)
        .batch(READ_BATCH)
        .map(lambda records: _read_batch(records, num_classes, multi_label, seed), num_parallel_calls=tf.data.AUTOTUNE)
    )
    hashes, labels = [], []
    for batch_hashes, batch_labels in batches.as_numpy_iterator():
        hashes.append(batch_hashes)
        labels.append(batch_labels)
    hashes = np.concatenate(hashes) if hashes else np.zeros([0], np.int64)
    if multi_label:
        hot = np.concatenate(labels) if labels else np.zeros([0, num_classes], np.float32)
        return _multi_label(hashes, hot, seed)
    ids = np.concatenate(labels) if labels else np.zeros([0], np.int64)
    return _by_class(hashes, ids, num_classes, seed)


def _read_batch(records, num_classes: int, multi_label: bool, seed: int):
    parsed = tf.io.parse_example(records, _key_and_label_spec(multi_label))
    target = features.label_target(parsed, num_classes, multi_label)
    return _hashes(parsed[features.KEY], records, seed), target


def _by_class(hashes: np.ndarray, ids: np.ndarray, num_classes: int, seed: int) -> Holdout:
    thresholds, train_counts, held_counts = [], [], []
    for c in range(num_classes):
        ordered = np.sort(hashes[ids == c])
        k = held_count(len(ordered))
        # held out: hash < threshold (copies of a file share a hash, so they fall on the same side)
        threshold = int(ordered[k - 1]) + 1 if k else 0
        held = int((ordered < threshold).sum())
        thresholds.append(threshold)
        held_counts.append(held)
        train_counts.append(len(ordered) - held)
    # the examples of no known class (an id out of range) train, as they did before
    return Holdout(
        tuple(thresholds),
        seed,
        False,
        tuple(train_counts),
        tuple(held_counts),
        len(hashes) - sum(held_counts),
        sum(held_counts),
    )


def _multi_label(hashes: np.ndarray, hot: np.ndarray, seed: int) -> Holdout:
    ordered = np.sort(hashes)
    k = held_count(len(ordered))
    threshold = int(ordered[k - 1]) + 1 if k else 0
    held = hashes < threshold
    return Holdout(
        (threshold,),
        seed,
        True,
        tuple(int(n) for n in hot[~held].sum(0)),
        tuple(int(n) for n in hot[held].sum(0)),
        int((~held).sum()),
        int(held.sum()),
    )


class Part(NamedTuple):
    """One side of a holdout: the held-out examples (validation), or the rest (training)."""

    holdout: Holdout
    held: bool

    @property
    def count(self) -> int:
        return self.holdout.held_examples if self.held else self.holdout.train_examples

    def keep(self, records: tf.data.Dataset) -> tf.data.Dataset:
        """The serialized records of this part, in their order. Judged KEEP_BATCH at a time (one vectorised parse
        and hash a batch: record by record, streamed pixels read 2.9x as slowly), then unbatched."""
        holdout, held = self.holdout, self.held
        thresholds = tf.constant(list(holdout.thresholds), tf.int64)
        classes = len(holdout.thresholds)
        spec = {features.KEY: _key_and_label_spec(False)[features.KEY]}
        if not holdout.multi_label:
            spec.update(features.label_spec(False))

        def kept(batch):
            parsed = tf.io.parse_example(batch, spec)
            hashed = _hashes(parsed[features.KEY], batch, holdout.seed)
            if holdout.multi_label:
                threshold = thresholds[0]
            else:  # an id out of range (no known class) is never held out
                label = parsed[features.LABEL_KEY]
                known = (label >= 0) & (label < classes)
                threshold = tf.where(known, tf.gather(thresholds, tf.clip_by_value(label, 0, classes - 1)), 0)
            return tf.boolean_mask(batch, tf.equal(hashed < threshold, held))

        return records.batch(KEEP_BATCH).map(kept, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def validation_part(holdout: Holdout) -> Part:
    """What training validates on: the held-out part, or (nothing held out) the training part itself."""
    return Part(holdout, held=not holdout.empty)
