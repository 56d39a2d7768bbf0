"""Classifies image files with an exported model: what `imagepipe predict` runs.

The model is the SavedModel the Trainer exported (Pusher copies blessed ones to
<root>/serving/<name>/<version>/); its serving_default signature takes raw
encoded image bytes. Files that are not decodable images get a per-file error,
checked with the same rules as ingestion, and the others still get answers.
"""

import os
import stat
import unicodedata
from typing import Callable, Dict, Iterable, List, Optional

from components.image_example_gen.batch_ingest import max_file_bytes
from components.image_example_gen.image_check import BadImage, Reason, check_image
from components.image_example_gen.ingest_defaults import MAX_PIXELS


# Encoded bytes per serving call: a call holds its batch's decoded images too, so a batch of
# full-size photos stays a handful (the pipeline's Beam batches are bounded the same way).
BATCH_BYTES = 20 << 20


class ModelNotFound(FileNotFoundError):
    """No SavedModel where one was expected; the message says where to look."""


class ModelUnusable(ValueError):
    """A SavedModel that TensorFlow cannot load (or without the serving signature); one line."""


def load_serving(model_dir: str):
    """The model's serving_default signature, or ModelUnusable naming the folder and the fix."""
    import tensorflow as tf

    try:
        return tf.saved_model.load(model_dir).signatures["serving_default"]
    except Exception as e:  # noqa: BLE001 - TensorFlow raises many types for a damaged model
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ModelUnusable(f"--model {model_dir}: not a usable SavedModel ({type(e).__name__}: {first}); "
                            "give a model the pipeline pushed (<root>/serving/<name>) or run 'imagepipe run' "
                            "again") from None


def read_image_file(path: str, max_pixels: int) -> bytes:
    """The bytes of a regular file no bigger than an image within max_pixels can be; else BadImage.

    Opened without blocking and checked on the open file: a named pipe, a device (/dev/zero) or a
    huge file is refused before anything is read, as ingestion refuses them.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadImage(Reason.UNREADABLE, "not a regular file (a folder, pipe or device); not read")
        if st.st_size > max_file_bytes(max_pixels):
            raise BadImage(Reason.FILE_TOO_LARGE, f"{st.st_size:,} bytes: larger than any image within "
                                                  "--max-pixels could be; not read")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(max_file_bytes(max_pixels) + 1)
    finally:
        os.close(fd)


def printable(text: str) -> str:
    """Text for a terminal: control and format characters (escape sequences, bidi overrides) escaped."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C" else ch
                   for ch in text)


def resolve_model_dir(path: str) -> str:
    """A SavedModel folder, or a Pusher destination holding numbered versions (the newest wins)."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    if os.path.isdir(path):
        versions = [v for v in os.listdir(path)
                    if v.isdigit() and os.path.exists(os.path.join(path, v, "saved_model.pb"))]
        if versions:
            return os.path.join(path, max(versions, key=int))
    raise ModelNotFound(f"--model {path}: no SavedModel there (nor numbered versions of one); give a pushed "
                        "model folder such as .imagepipe/serving/imagepipe, or run 'imagepipe run' first")


def classify(model_dir: str, paths: List[str], top: int = 1, max_pixels: int = MAX_PIXELS) -> List[Dict]:
    """One result per path, in order: {'path', 'predictions': [(class, probability)...]} or {'path', 'error'}."""
    import tensorflow as tf

    results: List[Optional[Dict]] = [None] * len(paths)
    good, images = [], []
    for i, path in enumerate(paths):
        try:
            data = read_image_file(path, max_pixels)
            check_image(data, max_pixels)
        except OSError as e:
            results[i] = {"path": path, "error": f"cannot read: {e.strerror or e}"}
            continue
        except BadImage as e:
            results[i] = {"path": path, "error": f"{e.reason}: {e.detail}"}
            continue
        good.append(i)
        images.append(data)
    if images:
        serve = load_serving(resolve_model_dir(model_dir))
        for batch in byte_batches(range(len(images)), size=lambda k: len(images[k])):
            out = serve(image_bytes=tf.constant([images[k] for k in batch]))
            probabilities = out["probabilities"].numpy()
            names = [n.decode() for n in out["class_names"].numpy()[0]]
            for row, k in enumerate(batch):
                ranked = probabilities[row].argsort()[::-1][:top]
                results[good[k]] = {"path": paths[good[k]],
                                    "predictions": [(names[j], float(probabilities[row][j])) for j in ranked]}
    return results


def byte_batches(items: Iterable, size: Callable = len, max_bytes: int = BATCH_BYTES, max_items: int = 64):
    """Consecutive lists of items, each at most max_items and (unless one item alone) max_bytes."""
    batch, total = [], 0
    for item in items:
        size_of_item = size(item)
        if batch and (total + size_of_item > max_bytes or len(batch) == max_items):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size_of_item
    if batch:
        yield batch
