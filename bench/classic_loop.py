"""The notebook loop that ImageExampleGen replaces, as the benchmark's baseline.

`tf.io.read_file` + `tf.image.decode_jpeg` in a try/except, and one TFRecord
file per image (a common pattern in tutorials). Run it in a fresh process:
TensorFlow's import time is reported apart from the work.

    python -m bench.classic_loop CORPUS OUT
"""

import json
import os
import sys
import time


def run(corpus: str, out: str) -> dict:
    started = time.monotonic()
    import tensorflow as tf  # noqa: E402  (timed on purpose)

    imported = time.monotonic()
    os.makedirs(out, exist_ok=True)
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(corpus) for f in fs)
    classes = sorted({os.path.basename(os.path.dirname(p)) for p in paths})
    written = failed = 0
    for i, path in enumerate(paths):
        try:
            data = tf.io.read_file(path)
            image = tf.image.decode_jpeg(data, channels=3)
            label = classes.index(os.path.basename(os.path.dirname(path)))
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data.numpy()])),
                        "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[image.shape[0]])),
                        "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[image.shape[1]])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                )
            )
            with tf.io.TFRecordWriter(os.path.join(out, f"{i:07d}.tfrecord")) as writer:
                writer.write(example.SerializeToString())
            written += 1
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
            failed += 1
    done = time.monotonic()
    return {
        "files": len(paths),
        "ok": written,
        "failed": failed,
        "import_seconds": imported - started,
        "work_seconds": done - imported,
    }


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
