"""Training-input benchmark: the Trainer's input function against the usual Keras loaders.

    python -m bench.input_benchmark                      # 4,000 photo-like JPEGs, 160x160, batch 128
    python -m bench.input_benchmark --files 2000 --rounds 1

Same clean corpus (no bad files: the Keras loaders crash on one), same size and
batch; every method in a fresh process, interleaved over rounds; medians.

  ImageDataGenerator        tf_keras ImageDataGenerator.flow_from_directory
  image_dataset_from_dir    keras.utils.image_dataset_from_directory
  tfrecord+decode           ImageExampleGen's records, decode_jpeg + resize in tf.data (AUTOTUNE)
  trainer input             trainer/input_pipeline.make_dataset over Transform-style uint8 pixel records
  trainer input, cached     the same, from the second epoch (the records fit the cache)

"images/s" is a full pass over the data after one warm-up pass; "fit epoch s" is
a whole Keras 3 `fit` epoch of a tiny model (global pooling + softmax) on that
input, so iterator start-up and tear-down are counted too. The record sizes
show what Transform materialises, per image, against the JPEG files.
"""

import argparse
import json
import os
import statistics
import sys
import time

from bench import measure_in_fresh_process

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
METHODS = ("ImageDataGenerator", "image_dataset_from_dir", "tfrecord+decode", "trainer input", "trainer input, cached")


def _records(corpus, size, workdir):
    """Writes (once) raw records as ImageExampleGen does and pixel records as Transform does."""
    import tensorflow as tf

    from images.decoding import decode_and_resize
    from trainer import features

    raw_path, pixel_path = os.path.join(workdir, "raw.tfrecord.gz"), os.path.join(workdir, f"pixels-{size}.gz")
    if os.path.exists(pixel_path):
        return raw_path, pixel_path
    classes = sorted(d for d in os.listdir(corpus) if not d.startswith("."))
    files = [
        (os.path.join(corpus, c, f), i)
        for i, c in enumerate(classes)
        for f in sorted(os.listdir(os.path.join(corpus, c)))
    ]
    with (
        tf.io.TFRecordWriter(raw_path + ".tmp", "GZIP") as raw,
        tf.io.TFRecordWriter(pixel_path + ".tmp", "GZIP") as px,
    ):
        for path, label in files:
            data = open(path, "rb").read()
            raw.write(
                tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            features.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        }
                    )
                ).SerializeToString()
            )
            pixels = tf.io.serialize_tensor(decode_and_resize(tf.constant(data), size, 3)).numpy()
            px.write(
                tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            features.PIXELS_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels])),
                            features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        }
                    )
                ).SerializeToString()
            )
    os.replace(raw_path + ".tmp", raw_path)
    os.replace(pixel_path + ".tmp", pixel_path)
    return raw_path, pixel_path


def _dataset(method, corpus, size, batch, workdir):
    """(iterable that yields batches, batches per pass, a tf.data.Dataset or None)."""
    import tensorflow as tf

    if method == "ImageDataGenerator":
        import tf_keras

        gen = tf_keras.preprocessing.image.ImageDataGenerator(rescale=1 / 255.0).flow_from_directory(
            corpus, target_size=(size, size), batch_size=batch, class_mode="sparse", shuffle=True, seed=1
        )
        return gen, len(gen), None
    if method == "image_dataset_from_dir":
        import keras

        ds = keras.utils.image_dataset_from_directory(corpus, image_size=(size, size), batch_size=batch, seed=1)
        return ds.prefetch(tf.data.AUTOTUNE), None, ds.prefetch(tf.data.AUTOTUNE)
    raw_path, pixel_path = _records(corpus, size, workdir)
    if method == "tfrecord+decode":

        def decode(record):
            parsed = tf.io.parse_single_example(
                record,
                {"image/encoded": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)},
            )
            image = tf.image.resize(tf.io.decode_jpeg(parsed["image/encoded"], channels=3), (size, size))
            return image, parsed["label"]

        ds = (
            tf.data.TFRecordDataset(raw_path, "GZIP")
            .shuffle(1024, seed=1)
            .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch)
            .prefetch(tf.data.AUTOTUNE)
        )
        return ds, None, ds
    from trainer import input_pipeline
    from trainer.hparams import HParams

    cache = 10**6 if method.endswith("cached") else 1  # 1 MB: too small, so no cache
    ds = input_pipeline.make_dataset(
        [pixel_path], HParams(image_size=size, batch_size=batch, cache_megabytes=cache), training=True
    )
    return ds, None, ds


def measure(method, corpus, size, batch, workdir):
    import keras

    data, steps, ds = _dataset(method, corpus, size, batch, workdir)
    files = sum(len(fs) for _, _, fs in os.walk(corpus))

    def one_pass():
        n = 0
        for i, (x, _) in enumerate(data):
            n += int(x.shape[0])
            if steps is not None and i + 1 >= steps:
                break
        return n

    one_pass()  # warm-up (and, when cached, fills the cache)
    started = time.monotonic()
    seen = one_pass()
    seconds = time.monotonic() - started
    result = {"method": method, "images": seen, "seconds": seconds, "images_per_s": seen / seconds, "files": files}
    if ds is not None:
        model = keras.Sequential(
            [
                keras.Input((size, size, 3)),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(2, activation="softmax"),
            ]
        )
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        model.fit(ds, epochs=1, verbose=0)  # warm-up epoch
        started = time.monotonic()
        model.fit(ds, epochs=2, verbose=0)
        result["fit_epoch_seconds"] = (time.monotonic() - started) / 2
    return result


def _sizes(corpus, size, workdir):
    raw_path, pixel_path = _records(corpus, size, workdir)
    files = [os.path.join(d, f) for d, _, fs in os.walk(corpus) for f in fs]
    jpeg = sum(os.path.getsize(f) for f in files) / len(files)
    return {
        "jpeg_bytes_per_image": jpeg,
        "raw_record_bytes_per_image": os.path.getsize(raw_path) / len(files),
        "uint8_record_bytes_per_image": os.path.getsize(pixel_path) / len(files),
        "float32_pixel_bytes_per_image": size * size * 3 * 4,
    }


def run_fresh(method, args):
    return measure_in_fresh_process(
        "bench.input_benchmark",
        ["--measure", method, "--corpus", args.corpus, "--size", str(args.size), "--batch", str(args.batch)],
    )


def main(argv=None):
    from bench import corpus as corpus_lib

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.measure:
        args.corpus = os.path.join(OUT, f"clean-corpus-{args.files}")
        if not os.path.exists(args.corpus):
            corpus_lib.build(args.corpus, args.files, bad_files=False)
    # Records are cached per corpus: a run with another --files must not reuse them.
    workdir = os.path.join(OUT, "input", os.path.basename(args.corpus))
    os.makedirs(workdir, exist_ok=True)
    if args.measure:
        print(json.dumps(measure(args.measure, args.corpus, args.size, args.batch, workdir)))
        return 0
    runs = {m: [] for m in METHODS}
    for round_no in range(args.rounds):
        for method in METHODS if round_no % 2 == 0 else tuple(reversed(METHODS)):
            runs[method].append(run_fresh(method, args))
            print(f"round {round_no + 1} {method}: {runs[method][-1]['images_per_s']:.0f} images/s", file=sys.stderr)
    base = statistics.median(r["images_per_s"] for r in runs["ImageDataGenerator"])
    print(
        f"\n{args.files:,} photo-like JPEGs at {args.size}x{args.size}, batch {args.batch}, "
        f"median of {args.rounds} rounds, 2 cores"
    )
    print(f"{'input':<24} {'images/s':>9} {'x ImageDataGenerator':>21} {'fit epoch s':>12}")
    report = {"files": args.files, "size": args.size, "batch": args.batch, "methods": {}}
    for method in METHODS:
        rate = statistics.median(r["images_per_s"] for r in runs[method])
        fit = [r["fit_epoch_seconds"] for r in runs[method] if "fit_epoch_seconds" in r]
        fit_s = f"{statistics.median(fit):.2f}" if fit else "-"
        report["methods"][method] = {
            "images_per_s": round(rate),
            "vs_image_data_generator": round(rate / base, 2),
            "fit_epoch_seconds": statistics.median(fit) if fit else None,
            "runs": runs[method],
        }
        print(f"{method:<24} {rate:>9,.0f} {rate / base:>20.2f}x {fit_s:>12}")
    sizes = _sizes(args.corpus, args.size, workdir)
    report["bytes_per_image"] = sizes
    jpeg = sizes["jpeg_bytes_per_image"]
    print(
        f"\nbytes per image: JPEG {jpeg:,.0f}; raw examples {sizes['raw_record_bytes_per_image']:,.0f} "
        f"({sizes['raw_record_bytes_per_image'] / jpeg:.2f}x); Transform's uint8 pixels "
        f"{sizes['uint8_record_bytes_per_image']:,.0f} ({sizes['uint8_record_bytes_per_image'] / jpeg:.2f}x); "
        f"float32 pixels would be {sizes['float32_pixel_bytes_per_image']:,} "
        f"({sizes['float32_pixel_bytes_per_image'] / jpeg:.1f}x)"
    )
    with open(os.path.join(OUT, "input.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
