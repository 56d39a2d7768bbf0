"""The frozen backbone the features step runs: made once, fingerprinted, and kept in the cache.

prepare() runs in the executor's process: it makes the backbone as the Trainer would (hp.weights:
"imagenet", a file, or random weights drawn from the seed), hashes its weights, and stores them in the
cache folder of that fingerprint. The Trainer then loads that one weights file, so the features and the
exported model come from the same weights, bit for bit, and nobody downloads ImageNet weights but the
first run. Beside them, prepare() stores the feature extractor (scaling, backbone, pooling) frozen into
one TensorFlow graph with those weights as constants: a Beam worker (Dataflow's too) loads it in about
0.5 s, where making the Keras model, loading its weights and tracing it took 2-2.5 s (MobileNetV2 at
160 px on 2 cores), the larger part of a next span's features step, which runs the backbone only on
its new images. Its features agree with the Keras model's within 1e-4 (measured: 3e-5 at most on
vectors of magnitude 5): the graph optimizer folds the constant BatchNorm into the convolutions.
Without a GPU or TPU the graph runs on ONNX Runtime, converted at load (runtimes.py: 1.5x as fast here).

Making a backbone to hash its weights costs a second or two, every run. So the first run also notes,
under `sources/`, which fingerprint a source of weights gave: the SHA-256 of the weights file's bytes
(the one given, or Keras' downloaded ImageNet file), or the seed of random weights, with the model,
input, scaling and versions. A later run with the same source finds the fingerprint there and makes
no backbone at all unless an image is missing from the cache (the workers make theirs lazily). Another
--weights file has other bytes, so another source, and is made and hashed anew.
"""

import hashlib
import json
import os
from typing import NamedTuple, Optional

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf.message import DecodeError

# TensorFlow's own freezing (what tf.compat.v1's graph_util wraps); it has no public TF2 name.
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from components.features import feature_cache, runtimes
from storage import files as fs
from trainer import models
from trainer.hparams import HParams
from trainer.imagenet_weights import imagenet_weights_path

# What turns pixels into the backbone's input (trainer/models.py _scaled), by model: part of the fingerprint.
SCALING = {
    "efficientnet_lite0": "(x - 127) / 128",
    "mobilenet_v2": "rescale 1/127.5 offset -1",
    "efficientnet_b0": "inside the backbone",
}


class Prepared(NamedTuple):
    fingerprint: str
    weights_file: str  # the backbone's weights, in the cache
    dim: int  # length of the pooled vector
    graph_file: str  # the frozen feature extractor, in the cache (made again from weights_file if missing)


def _versions() -> dict:
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "format": feature_cache.FORMAT_VERSION}


def _described(hp: HParams) -> dict:
    return {
        "model": hp.model,
        "image_size": hp.image_size,
        "channels": hp.channels,
        "scaling": SCALING[hp.model],
        **_versions(),
    }


def source_key(hp: HParams) -> Optional[str]:
    """A cheap key of what the backbone is made from, or None when only making it tells (ImageNet weights
    not downloaded yet)."""
    if not hp.weights:
        weights = f"random, seed {hp.seed}"
    else:
        path = imagenet_weights_path(hp.model, hp.image_size) if hp.weights == "imagenet" else hp.weights
        if not fs.exists(path):
            return None
        weights = "sha256:" + hashlib.sha256(fs.read_bytes(path)).hexdigest()
    return hashlib.sha256(json.dumps({**_described(hp), "weights": weights}, sort_keys=True).encode()).hexdigest()[:32]


def _file_sha256(path: str) -> Optional[str]:
    try:
        return hashlib.sha256(fs.read_bytes(path)).hexdigest()
    except Exception:  # noqa: BLE001 - missing or unreadable (locally or in an object store)
        return None


def _known(cache_root: str, key: Optional[str]) -> Optional[Prepared]:
    """The note of a source of weights, when its weights file is still whole (its SHA-256 as noted: a file cut
    short by a copy or a full disk is made again, never loaded)."""
    if not key:
        return None
    try:
        known = json.loads(fs.read_bytes(fs.join(cache_root, feature_cache.SOURCES_DIR, key + ".json")))
        folder = fs.join(cache_root, known["fingerprint"])
        weights_file = fs.join(folder, feature_cache.WEIGHTS_FILE)
        if known.get("weights_file_sha256") and _file_sha256(weights_file) == known["weights_file_sha256"]:
            return Prepared(
                known["fingerprint"], weights_file, int(known["dim"]), fs.join(folder, feature_cache.GRAPH_FILE)
            )
    except Exception:  # noqa: BLE001 - missing or unreadable: made again
        pass
    return None


def prepare(hp: HParams, cache_root: str) -> Prepared:
    key = source_key(hp)
    prepared = _known(cache_root, key)
    if prepared is None:
        prepared = _make(hp, cache_root)
        key = key or source_key(hp)  # the ImageNet weights are on disk now that the backbone was made
        if key:
            feature_cache.write_whole(
                fs.join(cache_root, feature_cache.SOURCES_DIR, key + ".json"),
                json.dumps(
                    {
                        "fingerprint": prepared.fingerprint,
                        "dim": prepared.dim,
                        "weights_file_sha256": _file_sha256(prepared.weights_file),
                    }
                ).encode(),
            )
    feature_cache.touch(cache_root, prepared.fingerprint)
    return prepared


def _make(hp: HParams, cache_root: str) -> Prepared:
    """Makes the backbone, fingerprints its weights as loaded, and keeps them in the cache."""
    keras.utils.set_random_seed(hp.seed)  # random weights (--weights '') follow the seed
    backbone = models.make_backbone(hp)
    digest = hashlib.sha256()
    for weight in backbone.weights:
        digest.update(weight.path.encode())
        digest.update(np.asarray(weight.numpy()).tobytes())
    dim = int(backbone.output_shape[-1])
    described = {**_described(hp), "weights_sha256": digest.hexdigest(), "dim": dim}
    fingerprint = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]
    folder = fs.join(cache_root, fingerprint)
    weights_file = fs.join(folder, feature_cache.WEIGHTS_FILE)
    info_file = fs.join(folder, feature_cache.INFO_FILE)
    try:
        noted = json.loads(fs.read_bytes(info_file)).get("weights_file_sha256")
    except Exception:  # noqa: BLE001 - missing or unreadable
        noted = None
    if not noted or _file_sha256(weights_file) != noted:  # missing, or not whole (cut short): written again
        local = models.staged_path(feature_cache.WEIGHTS_FILE)
        try:
            backbone.save_weights(local)
            data = open(local, "rb").read()
            feature_cache.write_whole(weights_file, data)
        finally:
            models.discard_staged(local)
        info = {
            **described,
            "weights": hp.weights or f"random (seed {hp.seed})",
            "weights_file_sha256": hashlib.sha256(data).hexdigest(),
        }
        feature_cache.write_whole(info_file, json.dumps(info, indent=1).encode())
    prepared = Prepared(fingerprint, weights_file, dim, fs.join(folder, feature_cache.GRAPH_FILE))
    if not fs.exists(prepared.graph_file):
        _store_graph(hp, backbone, prepared)
    return prepared


GRAPH_INPUT, GRAPH_OUTPUT = "pixels:0", "Identity:0"  # the frozen graph's placeholder and result


def frozen_graph(hp: HParams, backbone) -> bytes:
    """The feature extractor (float32 pixels 0..255 -> pooled vector) as a serialized GraphDef whose
    variables are constants: all a worker needs to compute features, without Keras."""
    model = models.feature_extractor(hp, backbone)
    traced = tf.function(lambda pixels: model(pixels, training=False)).get_concrete_function(
        tf.TensorSpec([None, hp.image_size, hp.image_size, hp.channels], tf.float32, name="pixels")
    )
    frozen = convert_variables_to_constants_v2(traced)
    names = ([t.name for t in frozen.inputs], [t.name for t in frozen.outputs])
    if names != ([GRAPH_INPUT], [GRAPH_OUTPUT]):
        raise RuntimeError(
            f"the frozen feature extractor has inputs and outputs {names}, not {GRAPH_INPUT} and "
            f"{GRAPH_OUTPUT}: TensorFlow named them otherwise"
        )
    return frozen.graph.as_graph_def().SerializeToString()


def load_extractor(hp: HParams, prepared: Prepared) -> runtimes.Extractor:
    """The prepared backbone's frozen graph, loaded: a function of float32 pixels [n, size, size, channels] ->
    features [n, dim] (numpy), on the runtime runtimes.choose() takes for this machine. A cache without the graph
    (written before it was kept, or damaged) has it made again from the weights, as _make() makes it, and stored for
    the next run."""
    if fs.exists(prepared.graph_file):
        graph = fs.read_bytes(prepared.graph_file)
        if _graph_digest_noted(prepared) == hashlib.sha256(graph).hexdigest():
            try:
                return _loaded(hp, graph, prepared)
            except DecodeError:  # pragma: no cover - its digest matched: as written
                pass
        logging.warning("BackboneFeatures: %s is not the graph the cache wrote; made again", prepared.graph_file)
    return _loaded(hp, _store_graph(hp, models.make_backbone(hp, prepared.weights_file), prepared), prepared)


def _graph_digest_file(prepared: Prepared) -> str:
    return fs.join(os.path.dirname(prepared.graph_file), feature_cache.GRAPH_DIGEST_FILE)


def _graph_digest_noted(prepared: Prepared) -> str:
    """The SHA-256 the cache noted for its graph ("" when none was: an older cache, or the graph's write was cut
    short before its digest's): a graph damaged in place (4 KB overwritten parses, and computes other features)
    is made again from the weights, which the cache checks by their own SHA-256."""
    try:
        return fs.read_bytes(_graph_digest_file(prepared)).decode("ascii").strip()
    except Exception:  # noqa: BLE001 - missing or unreadable
        return ""


def _store_graph(hp: HParams, backbone, prepared: Prepared) -> bytes:
    graph = frozen_graph(hp, backbone)
    feature_cache.write_whole(prepared.graph_file, graph)
    feature_cache.write_whole(_graph_digest_file(prepared), hashlib.sha256(graph).hexdigest().encode("ascii"))
    return graph


def _loaded(hp: HParams, graph: bytes, prepared: Prepared) -> runtimes.Extractor:
    """The graph on the runtime chosen for this machine (runtimes.py: ONNX Runtime on CPUs, TensorFlow beside an
    accelerator), with the conversion the cache keeps for this graph, or keeping a new one."""
    graph_def = tf.compat.v1.GraphDef.FromString(graph)
    shape = (hp.image_size, hp.image_size, hp.channels)
    key = hashlib.sha256(graph).hexdigest().encode("ascii")  # the ONNX model's digest covers the graph it came from
    onnx_file = fs.join(os.path.dirname(prepared.graph_file), feature_cache.ONNX_FILE)
    digest_file = fs.join(os.path.dirname(prepared.graph_file), feature_cache.ONNX_DIGEST_FILE)

    def keep(model: bytes) -> None:
        feature_cache.write_whole(onnx_file, model)
        feature_cache.write_whole(digest_file, hashlib.sha256(key + model).hexdigest().encode("ascii"))

    return runtimes.choose(
        graph_def,
        in_tensorflow(hp, graph_def),
        GRAPH_INPUT,
        GRAPH_OUTPUT,
        shape,
        _kept(onnx_file, digest_file, key),
        keep,
    )


def _kept(onnx_file: str, digest_file: str, key: bytes) -> Optional[bytes]:
    """The ONNX model the cache kept for the graph of digest `key`, or None (none kept, another graph's, damaged)."""
    try:
        model, noted = fs.read_bytes(onnx_file), fs.read_bytes(digest_file).decode("ascii").strip()
    except Exception:  # noqa: BLE001 - missing or unreadable: converted again
        return None
    return model if hashlib.sha256(key + model).hexdigest() == noted else None


def in_tensorflow(hp: HParams, graph_def):
    """The frozen graph as a TensorFlow function: float32 pixels [n, size, size, channels] -> features [n, dim]."""

    def extract(pixels):
        return tf.graph_util.import_graph_def(
            graph_def, input_map={GRAPH_INPUT: pixels}, return_elements=[GRAPH_OUTPUT]
        )[0]

    shape = [None, hp.image_size, hp.image_size, hp.channels]
    return tf.compat.v1.wrap_function(extract, [tf.TensorSpec(shape, tf.float32)])
