"""The training input: tf.data over Transform's materialised records.

    shard files -> [shuffle files] -> interleave -> [cache] -> shuffle(seed) -> batch -> parse (vectorised)
      -> [augment] -> prefetch

Parsing happens after batching: one parse_example and one decode_raw per batch
instead of one per image. The serialized records are cached in memory when they
fit (decoding them again is a memcpy). Training shuffles every epoch: over the
whole set when it is cached (the shuffle buffer then holds references to the
cached records, not copies: measured, no extra memory), else over shuffled shards
and a buffer of as many records as SHUFFLE_SHARE of the cache budget holds.
ImageExampleGen already writes the examples in a shuffled order, so no class
arrives in a block even then. The records are counted once, so the dataset has a
known length: Keras 3 then knows each epoch's steps.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from trainer import features
from trainer.features import list_files
from trainer.holdout import Part
from trainer.hparams import HParams


class Balance(NamedTuple):
    """How training evens out imbalanced classes (trainer/class_balance.py): per-example loss weights by class,
    or batches drawn with these class shares."""

    mode: str  # "weights" or "sampling"
    weights: Sequence[float] = ()  # per class id, for "weights"
    shares: Sequence[float] = ()  # per class id, for "sampling"
    counts: Sequence[int] = ()  # training examples per class id


AUTOTUNE = tf.data.AUTOTUNE


# Without a cache, the shuffle buffer holds at most this share of the cache budget (hp.cache_limit_megabytes).
SHUFFLE_SHARE = 0.25


def measure(files: List[str]) -> Tuple[int, float]:
    """(records, megabytes of records as they are held in memory): one pass over the framing, no parsing."""
    records = tf.data.TFRecordDataset(files, compression_type=features.compression(files), num_parallel_reads=AUTOTUNE)
    count, size = records.reduce(
        (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
        lambda acc, r: (acc[0] + 1, acc[1] + tf.cast(tf.strings.length(r), tf.int64)),
    )
    return int(count), int(size) / 2**20


class Records(NamedTuple):
    """One split's records, counted once, and held in memory once when they fit the cache budget: every dataset
    built on them (the Tuner's trials, each with its batch size) shares that cache and reads no file again."""

    files: List[str]
    count: int
    megabytes: float
    in_memory: Optional[tf.data.Dataset]  # the serialized records, cached on their first whole pass; None: streamed


def read_records(file_patterns: List[str], hp: HParams, part: Optional[Part] = None) -> Records:
    """These files' records (of `part` of a holdout: trainer/holdout.py), counted, and cached when they fit."""
    counted = _counted(file_patterns, part)
    if counted.megabytes > hp.cache_limit_megabytes():
        return counted
    records = tf.data.TFRecordDataset(
        counted.files, compression_type=features.compression(counted.files), num_parallel_reads=AUTOTUNE
    )
    return counted._replace(in_memory=(part.keep(records) if part else records).cache())


def _counted(file_patterns: List[str], part: Optional[Part] = None) -> Records:
    """These files' records counted, nothing held: a dataset that reads and caches them for itself. Of a part of a
    holdout: its count, and its share of the megabytes."""
    files = list_files(file_patterns)
    count, megabytes = measure(files)
    if part is None:
        return Records(files, count, megabytes, None)
    return Records(files, part.count, megabytes * part.count / max(1, count), None)


def shuffle_buffer(records: int, megabytes: float, cached: bool, hp: HParams) -> int:
    """Every record when they are cached; else as many as SHUFFLE_SHARE of the cache budget holds."""
    if cached or not records:
        return max(1, records)
    fits = int(hp.cache_limit_megabytes() * SHUFFLE_SHARE / (megabytes / records))
    return max(1, min(records, max(fits, hp.batch_size)))


class Batching(NamedTuple):
    """How records are batched: `size` a batch (0: hp.batch_size), every batch of one shape (`drop_remainder`:
    what TPUs and several replicas need), and multi-label records' number of labels (`multi_hot`; 0: single-label)."""

    size: int = 0
    drop_remainder: bool = False
    multi_hot: int = 0


DEFAULT_BATCHING = Batching()  # hp.batch_size a batch, the last one short, single-label


def make_dataset(
    file_patterns: List[str],
    hp: HParams,
    training: bool,
    batching: Batching = DEFAULT_BATCHING,
    balance: Optional[Balance] = None,
    shared_records: Optional[Records] = None,
    part: Optional[Part] = None,
) -> tf.data.Dataset:
    """(images float32 [batch, size, size, channels] in 0..255, labels int64 [batch]), and with balance
    "weights" per-example loss weights [batch]. Multi-label records (multi_hot: their number of labels): the
    labels are multi-hot, float32 [batch, multi_hot] (their balance is in the loss: models.compile_model).

    drop_remainder gives every batch the same shape, which TPUs (XLA) and several replicas need. Training's epoch
    is then the records repeated and cut into whole batches (its last one goes on into the next shuffled pass);
    evaluation drops none: its last batch is padded with examples of weight 0, and every batch has weights [batch]
    (batched).

    `shared_records` (read_records of these files): the records counted and cached once for several datasets (the
    Tuner's trials); without, each call counts them and caches its own. `part`: only that part of a holdout's
    records (trainer/holdout.py; shared_records must be of the same part).
    """
    batch_size, drop_remainder, multi_hot = batching.size or hp.batch_size, batching.drop_remainder, batching.multi_hot
    sampling = training and balance is not None and balance.mode == "sampling"
    files, records, megabytes, shared = shared_records or _counted(file_patterns, part)
    cached = megabytes <= hp.cache_limit_megabytes()
    if cached and shared is not None and not sampling:
        dataset = shared
    else:
        dataset = tf.data.Dataset.from_tensor_slices(files)
        if training:
            dataset = dataset.shuffle(len(files), seed=hp.seed, reshuffle_each_iteration=True)
        dataset = dataset.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=features.compression(files)),
            cycle_length=min(len(files), 8),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )  # seeds reproduce
        if part:
            dataset = part.keep(dataset)
        # TFX Transform writes gzip records: reading them is inflate-bound, and the cache is a memcpy
        # (docs/benchmarks.md: Training input). So cache whenever they fit.
        if cached and not sampling:  # class-balanced batches cache each class's records instead (class_balanced)
            dataset = dataset.cache()
    buffer = shuffle_buffer(records, megabytes, cached, hp)
    if sampling:
        dataset = class_balanced(dataset, balance, buffer, records, hp.seed, cache=cached)
    elif training:
        dataset = dataset.shuffle(buffer, seed=hp.seed, reshuffle_each_iteration=True)
    dataset, padded = batched(dataset, records, batch_size, drop_remainder, training)
    dataset = dataset.map(
        parsed_keeping_weights(lambda records: parse_batch(records, hp, multi_hot), padded), num_parallel_calls=AUTOTUNE
    )
    if training and hp.augmentations:
        dataset = dataset.map(lambda x, y: (augment(x, hp), y), num_parallel_calls=AUTOTUNE)
    if training and balance is not None and balance.mode == "weights":
        dataset = dataset.map(with_weights(balance.weights), num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


# Sharding by file is used only when the files are alike in size (the largest at most this times the smallest):
# each worker reads count / workers records an epoch from its own files, so a worker with less data would repeat its
# records while another's go partly unseen.
FILE_SIZE_SPREAD = 1.25


def sharded_across_workers(
    dataset: tf.data.Dataset, files: List[str], workers: int, training: bool, sampling: bool = False
) -> tf.data.Dataset:
    """For several machines (MultiWorkerMirroredStrategy). Training shards by file when every worker gets an even
    share of the files (at least as many files as workers, a multiple of them or four a worker, sizes within
    FILE_SIZE_SPREAD): each worker reads its own files, so the input is read once in all, not once a worker
    (training's input repeats and counts its epoch in steps, so every worker takes the same steps). Otherwise it
    shards by data: each worker reads the records and keeps its part of the batches. So does evaluation, so that
    every eval example counts once, padding included (batched), and class-balanced sampling, whose rare class a
    worker's files might lack. Transform often writes one file a split. One machine's strategies do not shard."""
    by_file = training and not sampling and even_files(files, workers)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.FILE if by_file else tf.data.experimental.AutoShardPolicy.DATA
    )
    return dataset.with_options(options)


def even_files(files: List[str], workers: int) -> bool:
    """Whether `workers` readers can take these files in even shares (sharded_across_workers)."""
    if len(files) < workers or (len(files) % workers and len(files) < 4 * workers):
        return False
    sizes = [tf.io.gfile.stat(f).length for f in files]
    return max(sizes) <= FILE_SIZE_SPREAD * max(1, min(sizes))


def batched(
    records: tf.data.Dataset, count: int, batch_size: int, drop_remainder: bool, training: bool
) -> Tuple[tf.data.Dataset, bool]:
    """(`count` records in batches of a known number, whether they were padded). With drop_remainder (static
    shapes: a TPU, several replicas), every batch is whole: training's epoch is the records repeated and cut into
    ceil(count / batch_size) batches (its last batch goes on into the next shuffled pass, so each epoch sees every
    record: dropping the remainder lost half of a small set each epoch), and evaluation drops none: its batches are
    (records, weights), each record weight 1, then copies of the first at weight 0 up to a whole batch. The Keras
    metrics weigh the copies 0 (models.compile_model), and the loss's sum leaves them out, so val_loss is the eval
    mean times count / (batches x batch_size), the same factor every epoch (early stopping picks the same epoch)."""
    padded = drop_remainder and not training
    missing = -count % batch_size if padded else 0
    if padded:
        weighted = records.map(lambda r: (r, tf.constant(1.0)))
        if missing:
            weighted = weighted.concatenate(records.take(1).repeat(missing).map(lambda r: (r, tf.constant(0.0))))
        records = weighted
    if drop_remainder and training:
        batches = -(-count // batch_size)
        return records.repeat().batch(batch_size, drop_remainder=True).take(batches), padded
    batches = (count + missing) // batch_size if drop_remainder else -(-count // batch_size)
    return records.batch(batch_size, drop_remainder=drop_remainder).apply(
        tf.data.experimental.assert_cardinality(batches)
    ), padded


def parsed_keeping_weights(parse, padded: bool):
    """`parse` (a batch of records -> (x, y)) for batched()'s output: the padded batches' weights kept beside."""
    return (lambda records, weights: (*parse(records), weights)) if padded else parse


def with_weights(weights: Sequence[float]):
    """(x, labels) -> (x, labels, each example's loss weight, by its class)."""
    table = tf.constant(list(weights), tf.float32)
    return lambda x, y: (x, y, tf.gather(table, y))


def record_label(record: tf.Tensor) -> tf.Tensor:
    return tf.io.parse_single_example(record, {features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)})[
        features.LABEL_KEY
    ]


def class_balanced(
    records: tf.data.Dataset, balance: Balance, buffer: int, count: int, seed: int, cache: bool
) -> tf.data.Dataset:
    """`count` serialized records drawn class by class with balance.shares: each class's records reshuffled and
    repeated as often as its share asks (the rare classes' images recur within an epoch, the common ones' are
    not all seen in every epoch). Each class's shuffle buffer takes its part of `buffer`.

    Each class's stream filters the whole of `records`, and a rare class's repeats within an epoch: with `cache`
    (the records fit the cache budget), a class drawn at least 1.5 times its count an epoch has its records
    cached on their own, read from the files once (a cache of the whole set, filled by a stream per class at
    once, would not be complete when a rare class repeats, and each repeat would read the files again). A common
    class, drawn less than its count, reads the files once an epoch."""
    labelled = records.map(lambda r: (record_label(r), r), num_parallel_calls=AUTOTUNE)
    total = max(1, sum(balance.counts))
    streams, shares = [], []
    for class_id, (n, share) in enumerate(zip(balance.counts, balance.shares)):
        if n <= 0 or share <= 0:
            continue
        stream = labelled.filter(lambda label, _r, c=class_id: tf.equal(label, c)).map(lambda _label, r: r)
        stream = stream.cache() if cache and share * count >= 1.5 * n else stream
        streams.append(
            stream.shuffle(
                max(1, min(n, buffer * n // total + 1)), seed=seed + class_id, reshuffle_each_iteration=True
            ).repeat()
        )
        shares.append(float(share))
    drawn = tf.data.Dataset.sample_from_datasets(streams, weights=shares, seed=seed, rerandomize_each_iteration=True)
    return drawn.take(count)


def train_views(source: Dict[str, Any]) -> int:
    """Vectors a train record of the features step holds: the plain image's, then its augmented views'."""
    return source["views"].get("train", 0) + 1


def make_feature_dataset(
    file_patterns: List[str],
    hp: HParams,
    source: Dict[str, Any],
    training: bool,
    batching: Batching = DEFAULT_BATCHING,
    balance: Optional[Balance] = None,
    shared_records: Optional[Records] = None,
    part: Optional[Part] = None,
) -> tf.data.Dataset:
    """(features float32 [batch, dim], labels int64 [batch]) from the features step's records
    (components/features): what the frozen phase of a transfer model trains its head on.

    Small (a few kB an image), so cached and shuffled over the whole set when they fit the cache budget (the
    pixels' rule: HParams.cache_limit_megabytes); past it (a few million images) streamed from shuffled files
    through a bounded shuffle buffer. `source`: the features step's (trainer/training.py features_source): the
    vectors' "dim", and the augmented "views" of each split; a train record holds the plain image's vector, then its
    views'. Training draws one per image each epoch, evaluation takes the plain one. `shared_records` and `part`: as
    make_dataset's.
    """
    dim, views = source["dim"], train_views(source)
    batch_size, drop_remainder, multi_hot = batching.size or hp.batch_size, batching.drop_remainder, batching.multi_hot
    files, records, megabytes, shared = shared_records or _counted(file_patterns, part)
    cached = megabytes <= hp.cache_limit_megabytes()
    sampling = training and balance is not None and balance.mode == "sampling"
    reused = cached and shared is not None and not sampling  # class-balanced batches cache each class's records
    dataset = shared if reused else _feature_records(files, cached, training, hp)
    if part and not reused:
        dataset = part.keep(dataset)
    buffer = max(1, records) if cached else shuffle_buffer(records, megabytes, False, hp)
    if sampling:
        dataset = class_balanced(dataset, balance, buffer, records, hp.seed, cache=cached)
    elif training:
        dataset = (dataset.cache() if cached and not reused else dataset).shuffle(
            buffer, seed=hp.seed, reshuffle_each_iteration=True
        )
    elif cached and not reused:
        dataset = dataset.cache()
    dataset, padded = batched(dataset, records, batch_size, drop_remainder, training)
    parse = _feature_parser(dim, views, training, multi_hot, hp.seed)
    dataset = dataset.map(parsed_keeping_weights(parse, padded), num_parallel_calls=AUTOTUNE)
    if training and balance is not None and balance.mode == "weights":
        dataset = dataset.map(with_weights(balance.weights), num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


def _feature_records(files: List[str], cached: bool, training: bool, hp: HParams) -> tf.data.Dataset:
    """The features' serialized records: read in order when they are to be cached, else streamed from the files
    (shuffled for training)."""
    if cached:
        return tf.data.TFRecordDataset(files, compression_type=features.compression(files), num_parallel_reads=AUTOTUNE)
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=hp.seed, reshuffle_each_iteration=True)
    return dataset.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=features.compression(files)),
        cycle_length=min(len(files), 8),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )


def _feature_parser(dim: int, views: int, training: bool, multi_hot: int, seed: int):
    """A batch of feature records -> (vectors [batch, dim], labels): training draws one of each image's views."""
    spec = {
        features.FEATURES_KEY: tf.io.FixedLenFeature([views * dim], tf.float32),
        **features.label_spec(multi_hot > 0),
    }

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        vectors = tf.reshape(parsed[features.FEATURES_KEY], [-1, views, dim])
        target = features.label_target(parsed, multi_hot, multi_hot > 0)
        if training and views > 1:
            chosen = tf.random.uniform([tf.shape(vectors)[0]], 0, views, tf.int32, seed=seed)
            return tf.gather(vectors, chosen, batch_dims=1), target
        return vectors[:, 0], target

    return parse


def repeated(dataset: tf.data.Dataset) -> Tuple[tf.data.Dataset, int]:
    """(the training dataset repeated, its batches per epoch), for fit(steps_per_epoch=...): one iterator
    for the whole training. Keras otherwise makes a new one each epoch, and tearing one down stalls the
    next epoch by up to ~0.6 s here (measured on the digits: epochs of 0.63 s, every third 1.2 s)."""
    return dataset.repeat(), int(dataset.cardinality())


def parse_batch(records: tf.Tensor, hp: HParams, multi_hot: int = 0) -> Tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(
        records, {features.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string), **features.label_spec(multi_hot > 0)}
    )
    images = features.decode_pixels(parsed[features.PIXELS_KEY], hp.image_size, hp.channels)
    return images, features.label_target(parsed, multi_hot, multi_hot > 0)


def augment(images: tf.Tensor, hp: HParams) -> tf.Tensor:
    """Random per-image flips, crops and brightness on a batch (training only)."""
    augmentations = hp.augmentations
    if "flip" in augmentations:
        images = tf.image.random_flip_left_right(images, seed=hp.seed)
    if "crop" in augmentations:
        # Pad by 1/8 of the side on each edge, then crop back at a random offset.
        pad = max(1, hp.image_size // 8)
        padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
        images = tf.map_fn(
            lambda im: tf.image.random_crop(im, [hp.image_size, hp.image_size, hp.channels], seed=hp.seed), padded
        )
    if "brightness" in augmentations:
        delta = tf.random.uniform([tf.shape(images)[0], 1, 1, 1], -25.0, 25.0, seed=hp.seed)
        images = tf.clip_by_value(images + delta, 0.0, 255.0)
    return images


def augment_views(images: tf.Tensor, hp: HParams, seeds: tf.Tensor) -> tf.Tensor:
    """The same augmentations as augment(), but each image's drawn from its own seed ([batch, 2] int):
    reproducible per image and view, so the features step can cache the backbone's output of each view."""
    augmentations = hp.augmentations
    pad = max(1, hp.image_size // 8)
    shape = [hp.image_size, hp.image_size, hp.channels]

    def one(args):
        image, seed = args
        if "flip" in augmentations:
            image = tf.image.stateless_random_flip_left_right(image, seed)
        if "crop" in augmentations:
            padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
            image = tf.image.stateless_random_crop(padded, shape, seed=seed + 1)
        if "brightness" in augmentations:
            image = tf.clip_by_value(image + tf.random.stateless_uniform([], seed + 2, -25.0, 25.0), 0.0, 255.0)
        return image

    return tf.map_fn(one, (images, seeds), fn_output_signature=tf.TensorSpec(shape, tf.float32))
