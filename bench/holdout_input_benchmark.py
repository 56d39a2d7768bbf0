"""The Trainer's pixel input with and without a holdout part (its filter), side by side: seconds per pass.

python -m bench.holdout_input_benchmark 3000
"""

import hashlib
import os
import sys
import time

import numpy as np
import tensorflow as tf

from trainer import features, holdout, input_pipeline
from trainer.hparams import HParams

N, SIZE, OUT = int(sys.argv[1]), 160, os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "holdout-input")
path = os.path.join(OUT, f"part-{N}.gz")
if not os.path.exists(path):
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(path, "GZIP") as w:
        for i in range(N):
            px = tf.io.serialize_tensor(tf.constant(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8))).numpy()
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        features.PIXELS_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[px])),
                        features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 4])),
                        features.KEY: tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[hashlib.sha256(str(i).encode()).hexdigest().encode()])
                        ),
                    }
                )
            )
            w.write(ex.SerializeToString())
hp = HParams(model="cnn", image_size=SIZE, batch_size=128)
for cached in (True, False):
    hp = HParams(model="cnn", image_size=SIZE, batch_size=128, cache_megabytes=0 if cached else 1)
    hold = holdout.choose([path], 4, False, hp.seed)
    for name, part in (("no part (39fed87's)", None), ("training part", holdout.Part(hold, False))):
        ds = input_pipeline.make_dataset([path], hp, training=True, part=part)
        times = []
        for _ in range(3):
            t = time.monotonic()
            n = sum(int(x.shape[0]) for x, _ in ds)
            times.append(time.monotonic() - t)
        print(
            f"{'cached' if cached else 'streamed'} {name}: {n} images, passes {', '.join(f'{s:.2f}' for s in times)} s",
            flush=True,
        )
