"""The training input: tf.data over Transform's materialised records.

    shard files -> [shuffle files] -> interleave -> [average down] -> [cache] -> shuffle(seed) -> batch
      -> parse (vectorised) -> [augment] -> prefetch

Parsing happens after batching: one parse_example and one decode_raw per batch
instead of one per image. The serialized records are cached in memory when they
fit (decoding them again is a memcpy). Training shuffles every epoch: over the
whole set when it is cached (the shuffle buffer then holds references to the
cached records, not copies: measured, no extra memory), else over shuffled shards
and a buffer of as many records as SHUFFLE_SHARE of the cache budget holds.
ImageExampleGen already writes the examples in a shuffled order, so no class
arrives in a block even then. The records are counted once, so the dataset has a
known length: Keras 3 then knows each epoch's steps.

A cnn that averages its input down first (hp.cnn_downsample: --model auto's cnn candidate on 224 px images) trains
on its images averaged down once (Batching.downsampled): each image's exact sums over the squares it averages,
an eighth of the pixels' memory at 4 x 4, are what is cached and shuffled, and models.downsampled_view trains the
cnn on them.
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
    megabytes: float  # as they are held: the serialized records, or their images averaged down (Batching.downsampled)
    in_memory: Optional[tf.data.Dataset]  # them (or their sums), cached on their first whole pass; None: streamed


class Batching(NamedTuple):
    """How records are batched: `size` a batch (0: hp.batch_size), every batch of one shape (`drop_remainder`:
    what TPUs and several replicas need), multi-label records' number of labels (`multi_hot`; 0: single-label), and
    whether the images are taken averaged down hp.cnn_downsample x hp.cnn_downsample (`downsampled`:
    downsampled_images)."""

    size: int = 0
    drop_remainder: bool = False
    multi_hot: int = 0
    downsampled: bool = False


DEFAULT_BATCHING = Batching()  # hp.batch_size a batch, the last one short, single-label, full size


def read_records(
    file_patterns: List[str], hp: HParams, part: Optional[Part] = None, batching: Batching = DEFAULT_BATCHING
) -> Records:
    """These files' records (of `part` of a holdout: trainer/holdout.py), counted, and cached when they fit (their
    images averaged down with batching.downsampled)."""
    counted = _counted(file_patterns, hp, part, batching)
    if counted.megabytes > hp.cache_limit_megabytes():
        return counted
    records = tf.data.TFRecordDataset(
        counted.files, compression_type=features.compression(counted.files), num_parallel_reads=AUTOTUNE
    )
    records = part.keep(records) if part else records
    if batching.downsampled:
        records = downsampled_images(records, hp, batching.multi_hot)
    return counted._replace(in_memory=records.cache())


def _counted(
    file_patterns: List[str], hp: HParams, part: Optional[Part] = None, batching: Batching = DEFAULT_BATCHING
) -> Records:
    """These files' records counted, nothing held: a dataset that reads and caches them for itself. Of a part of a
    holdout: its count, and its share of the megabytes (with batching.downsampled: what its sums hold)."""
    files = list_files(file_patterns)
    count, megabytes = measure(files)
    if part is not None:
        count, megabytes = part.count, megabytes * part.count / max(1, count)
    if batching.downsampled:
        megabytes = _held_size(count, hp, batching.multi_hot)
    return Records(files, count, megabytes, None)


# An image averaged down is kept as its exact sums over each square: 255 x 16 x 16 (cnn_downsample's most) fits.
DOWNSAMPLED_DTYPE = tf.uint16


def _held_size(count: int, hp: HParams, multi_hot: int) -> float:
    """Megabytes `count` images averaged down hold (downsampled_images): their sums and their labels."""
    side = hp.image_size // hp.cnn_downsample
    label = 4 * multi_hot if multi_hot else 8
    return count * (side * side * hp.channels * DOWNSAMPLED_DTYPE.size + label) / 2**20


# Records parsed and averaged down this many at a time (one parse_example and one reduction a batch).
DOWNSAMPLE_BATCH = 256


def downsampled_images(records: tf.data.Dataset, hp: HParams, multi_hot: int = 0) -> tf.data.Dataset:
    """Serialized records -> {"sums": DOWNSAMPLED_DTYPE [size / k, size / k, channels], "label": the target}, one
    an image, in order: each k x k square's pixel sum (k = hp.cnn_downsample; exact: what AveragePooling2D averages,
    times k^2). What a downsampling cnn trains on (models.downsampled_view); the sides are cut to a multiple of k,
    as the pooling does."""
    k, side = hp.cnn_downsample, hp.image_size // hp.cnn_downsample

    def averaged_down(serialized):
        pixels, target = parse_pixel_bytes(serialized, hp, multi_hot)
        squares = tf.reshape(tf.cast(pixels[:, : side * k, : side * k], tf.int32), [-1, side, k, side, k, hp.channels])
        sums = tf.cast(tf.reduce_sum(squares, axis=[2, 4]), DOWNSAMPLED_DTYPE)
        return {"sums": sums, "label": target}

    return records.batch(DOWNSAMPLE_BATCH).map(averaged_down, num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()


def downsampled_batch(batch) -> Tuple[tf.Tensor, tf.Tensor]:
    """A batch of downsampled_images -> (the sums float32 [batch, size / k, size / k, channels], the targets)."""
    return tf.cast(batch["sums"], tf.float32), batch["label"]


def downsampled_label(image) -> tf.Tensor:
    """The class id of one of downsampled_images (class_balanced's label_of)."""
    return image["label"]


def shuffle_buffer(records: int, megabytes: float, cached: bool, hp: HParams) -> int:
    """Every record when they are cached; else as many as SHUFFLE_SHARE of the cache budget holds."""
    if cached or not records:
        return max(1, records)
    fits = int(hp.cache_limit_megabytes() * SHUFFLE_SHARE / (megabytes / records))
    return max(1, min(records, max(fits, hp.batch_size)))


def make_dataset(
    file_patterns: List[str],
    hp: HParams,
    training: bool,
    batching: Batching = DEFAULT_BATCHING,
    balance: Optional[Balance] = None,
    shared_records: Optional[Records] = None,
    part: Optional[Part] = None,
    probe: int = 0,
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
    records (trainer/holdout.py; shared_records must be of the same part). batching.downsampled: the images
    averaged down hp.cnn_downsample x hp.cnn_downsample, as their sums (downsampled_images: float32 [batch,
    size / k, size / k, channels] in 0..255 k^2), cached and shuffled in place of the records.

    `probe` (a pace probe's batches: a few steps timed, training.seconds_per_step): that many batches of the part's
    first records, read from the files in order and held on their own (repeated, they are timed from memory, as
    cached training runs). Neither the shared cache nor a shuffle buffer is filled for a few steps: --model auto's
    fine-tuned candidate filled the 224 px cache (1.2 GB at 10,000 images) to be timed, then was not tried.
    """
    batch_size, drop_remainder, multi_hot = batching.size or hp.batch_size, batching.drop_remainder, batching.multi_hot
    sampling = training and balance is not None and balance.mode == "sampling"
    files, records, megabytes, shared = shared_records or _counted(file_patterns, hp, part, batching)
    cached = megabytes <= hp.cache_limit_megabytes()
    buffer = shuffle_buffer(records, megabytes, cached, hp)
    if probe:
        records, sampling = min(records, probe * batch_size), False
    if cached and shared is not None and not sampling and not probe:
        dataset = shared
    else:
        dataset = _streamed(files, training and not probe, hp)
        if part:
            dataset = part.keep(dataset)
        if batching.downsampled:
            dataset = downsampled_images(dataset, hp, multi_hot)
        # TFX Transform writes gzip records: reading them is inflate-bound, and the cache is a memcpy
        # (docs/benchmarks.md: Training input). So cache whenever they fit.
        if probe:
            dataset = dataset.take(records).cache()
        elif cached and not sampling:  # class-balanced batches cache each class's records instead (class_balanced)
            dataset = dataset.cache()
    if sampling:
        label_of = downsampled_label if batching.downsampled else record_label
        dataset = class_balanced(dataset, balance, buffer, records, hp.seed, cache=cached, label_of=label_of)
    elif training and not probe:
        dataset = dataset.shuffle(buffer, seed=hp.seed, reshuffle_each_iteration=True)
    dataset, padded = batched(dataset, records, batch_size, drop_remainder, training)
    parse = downsampled_batch if batching.downsampled else (lambda records: parse_batch(records, hp, multi_hot))
    dataset = dataset.map(parsed_keeping_weights(parse, padded), num_parallel_calls=AUTOTUNE)
    if training and hp.augmentations:
        dataset = dataset.map(lambda x, y: (augment(x, hp), y), num_parallel_calls=AUTOTUNE)
    if training and balance is not None and balance.mode == "weights":
        dataset = dataset.map(with_weights(balance.weights), num_parallel_calls=AUTOTUNE)
    # autotuning off (features.NOT_AUTOTUNED; the AUTOTUNE maps run at the thread pool's size): Keras makes an iterator
    # each epoch, whose end waited for the tuning thread, the CPU idle (~51 s of a 10,000-image fine-tuned Trainer's
    # 164; the Trainer alone on that run, bench.trainer_stage_benchmark: 137.4 s median against 191.8 with it)
    return dataset.prefetch(AUTOTUNE).with_options(features.NOT_AUTOTUNED)


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
    records: tf.data.Dataset, balance: Balance, buffer: int, count: int, seed: int, cache: bool, label_of=record_label
) -> tf.data.Dataset:
    """`count` serialized records (or what `label_of` reads a class id from) drawn class by class with
    balance.shares: each class's records reshuffled and repeated as often as its share asks (the rare classes'
    images recur within an epoch, the common ones' are not all seen in every epoch). Each class's shuffle buffer
    takes its part of `buffer`.

    Each class's stream filters the whole of `records`, and a rare class's repeats within an epoch: with `cache`
    (the records fit the cache budget), a class drawn at least 1.5 times its count an epoch has its records
    cached on their own, read from the files once (a cache of the whole set, filled by a stream per class at
    once, would not be complete when a rare class repeats, and each repeat would read the files again). A common
    class, drawn less than its count, reads the files once an epoch."""
    labelled = records.map(lambda r: (label_of(r), r), num_parallel_calls=AUTOTUNE)
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
    files, records, megabytes, shared = shared_records or _counted(file_patterns, hp, part)
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
    return dataset.prefetch(AUTOTUNE).with_options(features.NOT_AUTOTUNED)  # as make_dataset's


def _feature_records(files: List[str], cached: bool, training: bool, hp: HParams) -> tf.data.Dataset:
    """The features' serialized records: read in order when they are to be cached, else streamed from the files
    (shuffled for training)."""
    if cached:
        return tf.data.TFRecordDataset(files, compression_type=features.compression(files), num_parallel_reads=AUTOTUNE)
    return _streamed(files, training, hp)


def _streamed(files: List[str], training: bool, hp: HParams) -> tf.data.Dataset:
    """These files' serialized records, read eight files at a time (in a shuffled file order for training)."""
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=hp.seed, reshuffle_each_iteration=True)
    return dataset.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=features.compression(files)),
        cycle_length=min(len(files), 8),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )  # seeds reproduce


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


def parse_pixel_bytes(records: tf.Tensor, hp: HParams, multi_hot: int = 0) -> Tuple[tf.Tensor, tf.Tensor]:
    """A batch of Transform's records -> (their pixels uint8 [batch, size, size, channels], their targets)."""
    parsed = tf.io.parse_example(
        records, {features.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string), **features.label_spec(multi_hot > 0)}
    )
    pixels = features.decode_pixel_bytes(parsed[features.PIXELS_KEY], hp.image_size, hp.channels)
    return pixels, features.label_target(parsed, multi_hot, multi_hot > 0)


def parse_batch(records: tf.Tensor, hp: HParams, multi_hot: int = 0) -> Tuple[tf.Tensor, tf.Tensor]:
    """A batch of Transform's records -> (images float32 in 0..255, targets)."""
    pixels, target = parse_pixel_bytes(records, hp, multi_hot)
    return tf.cast(pixels, tf.float32), target


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
