"""Which runtime computes the features: ONNX Runtime on a machine without an accelerator, TensorFlow on a GPU or TPU.

The frozen feature extractor (backbone.py) is one TensorFlow graph; tf2onnx converts it (about a second) and ONNX
Runtime runs it. Measured on 2 cores, EfficientNet-Lite0 at 224 px in batches of 32 (docs/benchmarks.md,
"Transfer learning: the backbone once"): TensorFlow 9.0 ms an image, ONNX Runtime 5.8 ms, and XLA (jit_compile)
196 ms (its CPU code for depthwise convolutions); ONNX Runtime's features agree with TensorFlow's within 1e-6 of the
largest. Each load checks that on a probe batch (AGREEMENT) and keeps TensorFlow, with a warning, when the conversion
fails or the features differ: the cache holds features of one backbone, whichever runtime computed them. A
conversion that agreed is kept in the features cache beside the graph (backbone.py), so a later process loads it in
~0.2 s instead of converting and checking again (~1.5 s).
"""

from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from absl import logging

ONNX, TENSORFLOW = "onnxruntime", "tensorflow"
AGREEMENT = 1e-4  # the largest difference allowed between the runtimes' features, relative to the largest feature
PROBE_IMAGES = 4


class Extractor:
    """float32 pixels [n, size, size, channels] -> features [n, dim] as numpy, on `runtime`."""

    def __init__(self, runtime: str, run: Callable[[np.ndarray], np.ndarray]):
        self.runtime = runtime
        self._run = run

    def __call__(self, pixels) -> np.ndarray:
        return self._run(np.asarray(pixels, np.float32))


def choose(
    graph_def: tf.compat.v1.GraphDef,
    tf_extract,
    input_name: str,
    output_name: str,
    shape,
    known: Optional[bytes] = None,
    keep: Optional[Callable[[bytes], None]] = None,
) -> Extractor:
    """The Extractor for this machine: ONNX Runtime when TensorFlow sees no GPU or TPU and the converted graph agrees
    with `tf_extract` (the graph in TensorFlow) on a probe batch; else TensorFlow. `known`: a conversion of this graph
    checked so before (the features cache keeps it: converting and checking cost ~1.5 s a process, the most of a
    small span's step); a new one that agrees is handed to `keep`."""
    in_tensorflow = Extractor(TENSORFLOW, lambda pixels: tf_extract(tf.constant(pixels)).numpy())
    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        return in_tensorflow
    if known is not None:
        try:
            return Extractor(ONNX, onnx_session(known))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for a model it refuses
            logging.warning("BackboneFeatures: the kept ONNX model does not load (%s); converted again", e)
    probe = _probe(shape)
    expected = in_tensorflow(probe)
    try:
        model = converted(graph_def, input_name, output_name)
        in_onnx = Extractor(ONNX, onnx_session(model))
        difference = float(np.abs(in_onnx(probe) - expected).max() / max(float(np.abs(expected).max()), 1e-12))
    except Exception as e:  # noqa: BLE001 - tf2onnx and onnxruntime raise many types for an op they lack
        logging.warning("BackboneFeatures: ONNX Runtime cannot run this backbone (%s); TensorFlow computes", e)
        return in_tensorflow
    if not difference <= AGREEMENT:
        logging.warning(
            "BackboneFeatures: ONNX Runtime's features differ from TensorFlow's by %.2g of the largest (more than "
            "%g); TensorFlow computes",
            difference,
            AGREEMENT,
        )
        return in_tensorflow
    if keep is not None:
        keep(model)
    return in_onnx


def converted(graph_def, input_name: str, output_name: str) -> bytes:
    """The graph as a serialized ONNX model (tf2onnx, ~1 s for EfficientNet-Lite0)."""
    # tf2onnx (~0.1 s): only computing features (and the Evaluator's pass, components/evaluator/predictions.py) needs it
    import tf2onnx

    model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=[input_name], output_names=[output_name])
    return model.SerializeToString()


def onnx_session(model: bytes) -> Callable[[np.ndarray], np.ndarray]:
    # onnxruntime (~0.05 s): only computing features (and the Evaluator's pass) needs it
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # Its threads wait asleep, not spinning: the step decodes and reads the cache beside the backbone.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    return lambda pixels: session.run(None, {feed: pixels})[0]


def _probe(shape) -> np.ndarray:
    """PROBE_IMAGES images of `shape` (size, size, channels), uint8-valued float32: smooth gradients with noise."""
    size, _, channels = shape
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    noise = np.random.default_rng(0).uniform(-40, 40, (PROBE_IMAGES, size, size, channels)).astype(np.float32)
    smooth = (ramp[None, :, None, None] + ramp[None, None, :, None]) / 2
    return np.clip(smooth + noise, 0, 255).round()
