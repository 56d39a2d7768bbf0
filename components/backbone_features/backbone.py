"""The frozen backbone the features step runs: made once per run, fingerprinted, and kept in the cache.

prepare() runs in the executor's process: it makes the backbone as the Trainer would (hp.weights:
"imagenet", a file, or random weights drawn from the seed), hashes its weights, and stores them in the
cache folder of that fingerprint. Every Beam worker (Dataflow's too) and the Trainer then load that one
weights file, so the features and the exported model are computed by the same backbone, bit for bit,
and nobody downloads ImageNet weights but the first run.
"""

import hashlib
import json
from typing import NamedTuple

from components.backbone_features import feature_cache
from components.image_example_gen import sources
from trainer.hparams import HParams

# What turns pixels into the backbone's input (trainer/models.py _scaled), by model: part of the fingerprint.
SCALING = {"mobilenet_v2": "rescale 1/127.5 offset -1", "efficientnet_b0": "inside the backbone"}


class Prepared(NamedTuple):
    fingerprint: str
    weights_file: str  # the backbone's weights, in the cache
    dim: int  # length of the pooled vector


def prepare(hp: HParams, cache_root: str) -> Prepared:
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer import models

    keras.utils.set_random_seed(hp.seed)  # random weights (--weights '') follow the seed
    backbone = models.make_backbone(hp)
    digest = hashlib.sha256()
    for weight in backbone.weights:
        digest.update(weight.path.encode())
        digest.update(np.asarray(weight.numpy()).tobytes())
    dim = int(backbone.output_shape[-1])
    described = {"model": hp.model, "image_size": hp.image_size, "channels": hp.channels,
                 "scaling": SCALING[hp.model], "weights_sha256": digest.hexdigest(), "dim": dim,
                 "tensorflow": tf.__version__, "keras": keras.__version__, "format": feature_cache.FORMAT_VERSION}
    fingerprint = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]
    folder = sources.join(cache_root, fingerprint)
    weights_file = sources.join(folder, feature_cache.WEIGHTS_FILE)
    if not sources.exists(weights_file):
        local = models.staged_path(feature_cache.WEIGHTS_FILE)
        try:
            backbone.save_weights(local)
            feature_cache.write_whole(weights_file, open(local, "rb").read())
        finally:
            models.discard_staged(local)
        info = {**described, "weights": hp.weights or f"random (seed {hp.seed})"}
        feature_cache.write_whole(sources.join(folder, feature_cache.INFO_FILE), json.dumps(info, indent=1).encode())
    feature_cache.touch(cache_root, fingerprint)
    return Prepared(fingerprint, weights_file, dim)
