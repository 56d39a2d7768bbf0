"""Why the model said that: attribution maps over an image's pixels, from the exported model itself.

The SavedModel the Trainer exports (trainer/export.py) carries `image_pixels` (Transform's decode and resize: the
pixels the serving graph's model sees) and `pixel_probabilities` (that model on pixels), so a map is computed on the
graph that serves, never on a copy of the model.

Integrated gradients (Sundararajan et al., 2017) from a blurred baseline: the gradient of the explained class's
probability, averaged along the straight path from the image blurred to the image, times the difference between
them, summed over the colour channels (absolute values). STEPS points a path; at most MAX_BATCH points (fewer for
large inputs: MAX_PIXELS_A_CALL) through the model at a time, so memory is bounded whatever the batch or the model. Chosen by measurement (docs/benchmarks.md, Explanations): on
bench/planted.py's patch set (150 images, all classified right), the patch held most of the map's top pixels (as
many as the patch has) in 100% of the images with the blurred baseline, 0% with a black one (it credits every bright
pixel: the patch's black half counts for nothing), 95% with both averaged and 65% with SmoothGrad; and it costs half
of both baselines (~7 ms an image at 64 px, 8 steps). The others stay selectable (`method`) for that comparison.

    explainer = Explainer(model_dir)
    pixels = explainer.pixels(image_bytes)                # uint8 [n, size, size, channels]
    maps, probabilities = explainer.explain(pixels)       # float32 [n, size, size], sums to 1 an image
    png = overlay_png(pixels[0], maps[0])
"""

import io
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

# Points on each path from a baseline to the image (Riemann sum, midpoints); each is a forward and a backward pass
# (~75 ms at 224 px with EfficientNet-Lite0 on 2 cores). 8 land where 24 do at a third of the cost (docs/benchmarks.md,
# Explanations): the 64 px CNN's maps hold the patch as well; EfficientNet-Lite0's at 224 px, on 90 images, mostly
# inside the patch 0.72 against 0.74 (6 steps: 0.68), correlating 0.83 with the 24-step maps.
STEPS = 8
MAX_BATCH = 256  # path points through the model at once (images x STEPS): bounds memory
# ... and at most this many input pixels a call: the gradient keeps every point's activations. Measured with
# EfficientNet-Lite0 at 224 px: 20 points a call (256 x 64 x 64 pixels) took 2.9 GB over the process, the run's
# peak; 5 points (256 x 32 x 32), +1.2 GB in the same time (78 s for 24 images); one point, +0.7 GB, twice the time.
MAX_PIXELS_A_CALL = 256 * 32 * 32
# Calls' worth of path points made at once (at 224 px: 80 points, 10 images of 8 steps, 96 MB with their gradients):
# the calls are all of one size (see _gradients), and the last one's padding is a small share.
PATH_CALLS = 16
BLUR_SIGMA = 0.08  # the blurred baseline's Gaussian, as a share of the image side
METHODS = ("ig-blur", "ig-black", "ig", "smoothgrad")  # ig: both baselines, averaged
METHOD = "ig-blur"


def batch_for(pixels: np.ndarray) -> int:
    """Points (images) through the model in one call, for images of this shape [n, height, width, channels]."""
    return max(1, min(MAX_BATCH, MAX_PIXELS_A_CALL // max(1, pixels.shape[1] * pixels.shape[2])))


def paths_at_once(images: np.ndarray, steps: int) -> int:
    """Images whose paths (`steps` points each) are made at once, then sent through the model in calls of batch_for()
    points: at most PATH_CALLS calls' worth (memory: their inputs and gradients), and MAX_BATCH points."""
    return max(1, min(MAX_BATCH, PATH_CALLS * batch_for(images)) // steps)


class ExplanationsUnavailable(RuntimeError):
    """A SavedModel exported before explanations existed; one line."""


class Explainer:
    def __init__(self, model_dir: str, load=None):
        """`load`: what loads the SavedModel (tf.saved_model.load when None); the Evaluator passes one that gives the
        model it has already loaded (components/evaluator/executor.py: ServingModelLoader)."""
        import tensorflow as tf  # TensorFlow (~4 s): prediction/ imports this module; only an Explainer needs it

        self._model = (load or tf.saved_model.load)(model_dir)
        if not hasattr(self._model, "pixel_probabilities") or not hasattr(self._model, "image_pixels"):
            raise ExplanationsUnavailable(
                f"{model_dir}: this model was exported without the functions explanations "
                "need (image_pixels, pixel_probabilities); run 'imagepipe run' again to "
                "export one"
            )
        self.class_names = [n.decode() for n in self._model.class_names.numpy()]
        # The same loaded model's serving signature: predict --explain classifies with it (one load, not two).
        self.serving = self._model.signatures["serving_default"]

    def pixels(self, images: Sequence[bytes]) -> np.ndarray:
        """Encoded images -> uint8 [n, size, size, channels], decoded and resized as serving does."""
        import tensorflow as tf  # TensorFlow (~4 s): prediction/ imports this module; only an Explainer needs it

        return self._model.image_pixels(tf.constant(list(images))).numpy()

    def probabilities(self, pixels: np.ndarray) -> np.ndarray:
        import tensorflow as tf  # TensorFlow (~4 s): prediction/ imports this module; only an Explainer needs it

        step = batch_for(pixels)
        parts = [
            self._model.pixel_probabilities(tf.constant(pixels[start : start + step], tf.float32)).numpy()
            for start in range(0, len(pixels), step)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.class_names)), np.float32)

    def explain(
        self, pixels: np.ndarray, targets: Optional[Sequence[int]] = None, method: str = METHOD, steps: int = STEPS
    ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """(maps float32 [n, size, size], each summing to 1 (0 where the model's gradient is 0 everywhere),
        probabilities [n, classes] or None) for the `targets` class ids; without targets, each image's most likely
        class, from the probabilities this returns (a caller that knows its targets pays no extra model call)."""
        if method not in METHODS:
            raise ValueError(f"explanation method {method!r}: use one of {', '.join(METHODS)}")
        probabilities = self.probabilities(pixels) if targets is None else None
        targets = probabilities.argmax(axis=1) if targets is None else np.asarray(targets)
        images = pixels.astype(np.float32)
        if method == "smoothgrad":
            raw = self._smoothgrad(images, targets, steps)
        else:
            baselines = {"ig": ("black", "blur"), "ig-black": ("black",), "ig-blur": ("blur",)}[method]
            raw = sum(self._integrated(images, _baseline(images, kind), targets, steps) for kind in baselines)
        totals = raw.reshape(len(raw), -1).sum(axis=1)
        return (raw / np.where(totals > 0, totals, 1.0)[:, None, None]).astype(np.float32), probabilities

    def _gradients(self, points: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """d probability[target] / d pixels at each point, batch_for() points a call."""
        import tensorflow as tf  # TensorFlow (~4 s): prediction/ imports this module; only an Explainer needs it

        out = np.zeros_like(points)
        step = batch_for(points)
        for start in range(0, len(points), step):
            part, chosen = points[start : start + step], targets[start : start + step]
            if len(points) > step > len(part):
                # Every call of the same size: TensorFlow builds a restored function's gradient for each new one (5 s
                # for EfficientNet-Lite0). The repeated points cost less than that.
                part, chosen = np.resize(part, (step, *part.shape[1:])), np.resize(chosen, step)
            chunk = tf.constant(part)
            with tf.GradientTape() as tape:
                tape.watch(chunk)
                probabilities = self._model.pixel_probabilities(chunk)
                score = tf.gather(probabilities, tf.constant(chosen, tf.int32), axis=1, batch_dims=1)
            out[start : start + step] = tape.gradient(score, chunk).numpy()[: len(points) - start]
        return out

    def _integrated(self, images: np.ndarray, baselines: np.ndarray, targets: np.ndarray, steps: int) -> np.ndarray:
        alphas = (np.arange(steps, dtype=np.float32) + 0.5) / steps
        maps = np.zeros(images.shape[:3], np.float32)
        per_call = paths_at_once(images, steps)
        for start in range(0, len(images), per_call):
            x, x0 = images[start : start + per_call], baselines[start : start + per_call]
            points = (x0[:, None] + alphas[None, :, None, None, None] * (x - x0)[:, None]).reshape(-1, *x.shape[1:])
            grads = self._gradients(points, np.repeat(targets[start : start + per_call], steps))
            mean = grads.reshape(len(x), steps, *x.shape[1:]).mean(axis=1)
            maps[start : start + per_call] = np.abs(((x - x0) * mean).sum(axis=-1))
        return maps

    def _smoothgrad(self, images: np.ndarray, targets: np.ndarray, steps: int, noise: float = 0.15) -> np.ndarray:
        """SmoothGrad (Smilkov et al., 2017), for comparison: absolute gradients averaged over `steps` noisy copies."""
        rng = np.random.default_rng(0)
        maps = np.zeros(images.shape[:3], np.float32)
        per_call = paths_at_once(images, steps)
        for start in range(0, len(images), per_call):
            x = images[start : start + per_call]
            noisy = x[:, None] + rng.normal(0, noise * 255.0, size=(len(x), steps, *x.shape[1:])).astype(np.float32)
            grads = self._gradients(
                np.clip(noisy, 0, 255).reshape(-1, *x.shape[1:]), np.repeat(targets[start : start + per_call], steps)
            )
            maps[start : start + per_call] = (
                np.abs(grads.reshape(len(x), steps, *x.shape[1:])).mean(axis=1).sum(axis=-1)
            )
        return maps


def _baseline(images: np.ndarray, kind: str) -> np.ndarray:
    if kind == "black":
        return np.zeros_like(images)
    from scipy.ndimage import gaussian_filter  # SciPy: only the blurred baseline needs it; no importer loads it

    sigma = BLUR_SIGMA * images.shape[1]
    return np.stack([gaussian_filter(image, sigma=(sigma, sigma, 0)) for image in images]).astype(np.float32)


def top_share_inside(attribution: np.ndarray, box: Sequence[int]) -> float:
    """How well a map finds box [x0, y0, x1, y1]: of the map's most attributed pixels, as many as the box holds, the
    share inside the box (1: the box's pixels are the map's top ones; a uniform map scores the box's area share)."""
    x0, y0, x1, y1 = box
    flat = attribution.ravel()
    count = max(1, (x1 - x0) * (y1 - y0))
    chosen = np.argpartition(-flat, count - 1)[:count]
    ys, xs = np.unravel_index(chosen, attribution.shape)
    return float(((xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)).mean())


def heat_colours(attribution: np.ndarray) -> np.ndarray:
    """uint8 [h, w, 3]: the map, scaled to its 99th percentile, from dark blue through red to yellow."""
    scale = float(np.percentile(attribution, 99)) or float(attribution.max()) or 1.0
    t = np.clip(attribution / scale, 0.0, 1.0)
    red = np.clip(3 * t, 0, 1)
    green = np.clip(3 * t - 1.5, 0, 1)
    blue = np.clip(0.5 - 3 * t, 0, 0.5) + np.clip(3 * t - 2.2, 0, 1)
    return (np.stack([red, green, blue], axis=-1) * 255).astype(np.uint8)


def overlay_png(pixels: np.ndarray, attribution: np.ndarray, size: int = 0) -> bytes:
    """The image (grey, dimmed) with the map over it, as PNG bytes; `size` resizes the result (0: as is)."""
    grey = pixels.astype(np.float32).mean(axis=-1, keepdims=True) * 0.6
    heat = heat_colours(attribution).astype(np.float32)
    weight = np.clip(attribution / (float(np.percentile(attribution, 99)) or 1.0), 0, 1)[..., None] * 0.8
    blended = Image.fromarray(np.clip(grey * (1 - weight) + heat * weight, 0, 255).astype(np.uint8))
    if size:
        blended = blended.resize((size, size), Image.NEAREST)
    out = io.BytesIO()
    blended.save(out, "PNG")
    return out.getvalue()


def class_average(maps: List[np.ndarray]) -> Optional[np.ndarray]:
    """'Where the model looks' for a class: the mean of its images' maps (each summing to 1)."""
    return np.mean(np.stack(maps), axis=0) if maps else None
