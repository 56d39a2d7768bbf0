"""Classifies image files with an exported model: what `imagepipe predict` runs.

The model is the SavedModel the Trainer exported (Pusher copies blessed ones to
<root>/serving/<name>/<version>/); its serving_default signature takes raw
encoded image bytes. Files that are not decodable images get a per-file error,
checked with the same rules as ingestion, and the others still get answers.
"""

import csv
import io
import json
import os
import posixpath
import queue
import stat
import threading
import time
import unicodedata
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

from components.image_example_gen import sources
from storage import files as fs
from components.image_example_gen.batch_ingest import check_file_size, max_file_bytes
from components.image_example_gen.image_check import BadImage, Reason, check_image
from components.image_example_gen.ingest_defaults import MAX_PIXELS
from components.spreadsheet import spreadsheet_safe
from storage import user_files


# Encoded bytes per serving call: a call holds its batch's decoded images too, so a batch of
# full-size photos stays a handful (the pipeline's Beam batches are bounded the same way).
BATCH_BYTES = 20 << 20


class ModelNotFound(FileNotFoundError):
    """No SavedModel where one was expected; the message says where to look."""


class ModelUnusable(ValueError):
    """A SavedModel that TensorFlow cannot load (or without the serving signature); one line."""


def load_serving(model_dir: str):
    """The model's serving_default signature (or a .tflite model behind the same call), or ModelUnusable
    naming the folder and the fix."""
    import tensorflow as tf

    try:
        if model_dir.endswith(".tflite"):
            return TFLiteServing(model_dir)
        return tf.saved_model.load(model_dir).signatures["serving_default"]
    except Exception as e:  # noqa: BLE001 - TensorFlow raises many types for a damaged model
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        kind = "TFLite model" if model_dir.endswith(".tflite") else "SavedModel"
        raise ModelUnusable(f"--model {model_dir}: not a usable {kind} ({type(e).__name__}: {first}); "
                            "give a model the pipeline pushed (<root>/serving/<name>) or run 'imagepipe run' "
                            "again") from None


class TFLiteServing:
    """A TFLite export (trainer/tflite_export.py) called like serving_default: encoded images in, the
    same outputs out. Images are decoded and resized by the function training used, then given to the
    model as the uint8 pixels an app would pass; class names come from labels.txt beside the file."""

    def __init__(self, path: str):
        import tensorflow as tf

        from trainer.preprocessing import decode_and_resize
        from trainer.tflite_export import LABELS_FILE, TFLiteClassifier

        labels = fs.join(os.path.dirname(path), LABELS_FILE)
        if not tf.io.gfile.exists(labels):
            raise FileNotFoundError(f"no {LABELS_FILE} beside it")
        with tf.io.gfile.GFile(labels) as f:
            self._names = [line.rstrip("\n") for line in f if line.strip()]
        with tf.io.gfile.GFile(path, "rb") as f:
            self._model = TFLiteClassifier(f.read())
        self._decode = decode_and_resize

    def __call__(self, image_bytes):
        import numpy as np
        import tensorflow as tf

        size, channels = self._model.image_size, self._model.channels
        pixels = np.stack([self._decode(encoded, size, channels).numpy() for encoded in image_bytes])
        probabilities = self._model.probabilities(pixels)
        return {"probabilities": tf.constant(probabilities),
                "class_names": tf.constant([[n.encode() for n in self._names]] * len(pixels))}


def read_image_file(path: str, max_pixels: int, size: int = -1) -> bytes:
    """The bytes of a regular file no bigger than an image within max_pixels can be; else BadImage.

    Opened without blocking and checked on the open file: a named pipe, a device (/dev/zero) or a
    huge file is refused before anything is read, as ingestion refuses them. A remote object is
    read through Beam's file systems, as ingestion reads gs:// (sources.py), once its size is known:
    `size` when its folder's listing gave it, else looked up.
    """
    if fs.is_remote(path):
        if size < 0:
            size = _remote_size(path)
        check_file_size(size, max_pixels)
        return fs.read_bytes(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadImage(Reason.UNREADABLE, "not a regular file (a folder, pipe or device); not read")
        check_file_size(st.st_size, max_pixels)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(max_file_bytes(max_pixels) + 1)
    finally:
        os.close(fd)


def _remote_size(path: str) -> int:
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([path], limits=[1])[0].metadata_list
    except BeamIOError as e:  # the store cannot be reached: a per-file error, like an unreadable file
        raise OSError(str(e).splitlines()[0][:200]) from None
    if not found or found[0].path != path:
        raise OSError("No such file or directory")
    return found[0].size_in_bytes


def printable(text: str) -> str:
    """Text for a terminal: control and format characters (escape sequences, bidi overrides) escaped."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C" else ch
                   for ch in text)


def resolve_model_dir(path: str) -> str:
    """A SavedModel folder, a .tflite file, or a Pusher destination holding numbered SavedModel versions
    (the newest wins); local or gs://."""
    if fs.is_remote(path):
        import tensorflow as tf

        try:
            fs.check_reachable(path)
        except sources.DataError as e:
            raise ModelNotFound(f"--model {e}") from None
        exists, isdir, listdir = tf.io.gfile.exists, tf.io.gfile.isdir, tf.io.gfile.listdir
    else:
        exists, isdir, listdir = os.path.exists, os.path.isdir, os.listdir
    if exists(fs.join(path, "saved_model.pb")) or (path.endswith(".tflite") and exists(path)):
        return path
    if isdir(path):
        versions = [v.rstrip("/") for v in listdir(path)]
        versions = [v for v in versions if v.isdigit() and exists(fs.join(path, v, "saved_model.pb"))]
        if versions:
            return fs.join(path, max(versions, key=int))
    raise ModelNotFound(f"--model {path}: no SavedModel there (nor numbered versions of one, nor a .tflite file); "
                        "give a pushed model folder such as .imagepipe/serving/imagepipe, or run 'imagepipe run' first")


class InputError(ValueError):
    """An argument that names no usable input (a manifest without a path column); one line."""


class Input(NamedTuple):
    """An image to classify, as the arguments name it."""

    path: str
    problem: Optional[Tuple[str, str]] = None  # (reason, detail) known before reading: a pipe, a row outside
    size: int = -1  # bytes, from a folder's listing (-1: unknown)


def expand_inputs(inputs: List[str]) -> Iterator[Input]:
    """An Input for every image the arguments name, in order.

    A file is itself; a folder (local, or a gs:// prefix that holds objects) is every file below it,
    sorted, with hidden files and OS clutter skipped as ingestion skips them, and pipes or devices
    flagged; a .csv manifest (local or gs://) is the paths of its `path` column, relative to the
    manifest's folder. A path that names nothing is itself too: reading it gives its error row. Cloud
    Storage that cannot be reached at all is an InputError (one line) at the first gs:// argument.
    """
    try:
        yield from _expand(inputs)
    except sources.DataError as e:
        raise InputError(str(e)) from None


def _expand(inputs: List[str]) -> Iterator[Input]:
    for item in inputs:
        if fs.is_dir(item):
            for rel, size, _, problem in sources.walk(item):
                if not sources.is_hidden(rel):
                    reason = Reason.OUTSIDE_ROOT if problem == sources.OUTSIDE_ROOT_PROBLEM else Reason.UNREADABLE
                    yield Input(fs.join(item, rel), (reason, problem) if problem else None, size)
        elif item.lower().endswith(".csv") and fs.exists(item):
            yield from _manifest_paths(item)
        else:
            yield Input(item)


def _manifest_paths(manifest: str) -> Iterator[Input]:
    """The rows' files, relative to the manifest's folder and, as in ingestion, only below it: a row naming
    /etc/passwd or ../../secret.txt is an error row, never read (it printed the file's first bytes)."""
    try:
        text = sources.read_manifest(manifest)
    except sources.DataError as e:
        raise InputError(str(e)) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if "path" not in (reader.fieldnames or []):
        raise InputError(f"{manifest}: a manifest needs a header naming a path column (path[,label,split])")
    folder = posixpath.dirname(manifest) if fs.is_remote(manifest) else os.path.dirname(os.path.abspath(manifest))
    for line_no, row in enumerate(reader, start=2):
        path = (row["path"] or "").strip()
        if path:
            where = f"{posixpath.basename(manifest)} line {line_no}"
            uri, problem = sources.manifest_row(folder, folder, path, where)
            yield Input(uri, problem)


def inspect_input(item: Input, max_pixels: int) -> Dict:
    """{'path', 'data': the file's bytes} for a readable image, else {'path', 'error'}; ingestion's checks."""
    result = {"path": item.path}
    try:
        if item.problem:
            raise BadImage(*item.problem)
        data = read_image_file(item.path, max_pixels, item.size)
        check_image(data, max_pixels)
        result["data"] = data
    except OSError as e:
        result["error"] = f"cannot read: {e.strerror or e}"
    except BadImage as e:
        result["error"] = f"{e.reason}: {e.detail}"
    return result


EVERY_CLASS = 0  # label_batch(top=EVERY_CLASS): every class, best first (the AutoML output lists them all)


def label_batch(serve, images: List[bytes], top: int, threshold: float = 0.0) -> List[Dict]:
    """{'predictions': [(class, probability), ...], 'ids': [class id, ...], 'unsure'} per image, best first,
    or {'error'} for an image TensorFlow cannot decode (it passed Pillow's checks); such an image makes the
    batch fail, so the batch is then served one image at a time and only that image gets the error.
    'unsure': the best probability is below the model's confidence threshold (model_threshold())."""
    import tensorflow as tf

    try:
        out = serve(image_bytes=tf.constant(images))
    except tf.errors.InvalidArgumentError as e:
        if len(images) == 1:
            return [{"error": f"undecodable: {(e.message or type(e).__name__).splitlines()[0][:200]}"}]
        return [row for image in images for row in label_batch(serve, [image], top, threshold)]
    probabilities = out["probabilities"].numpy()
    names = [n.decode() for n in out["class_names"].numpy()[0]]
    found = []
    for row in probabilities:
        best = row.argsort()[::-1][:top or len(names)]
        found.append({"predictions": [(names[j], float(row[j])) for j in best], "ids": [int(j) for j in best],
                      "unsure": bool(row[best[0]] < threshold)})
    return found


def model_threshold(model_dir: str) -> Tuple[float, str]:
    """(the confidence threshold that goes with a pushed model, how it was chosen): threshold.json beside the
    SavedModel (components/model_card); (0, "none") for a model without one (every image gets a class)."""
    from components.model_card import THRESHOLD_FILE

    path = fs.join(os.path.dirname(model_dir) if model_dir.endswith(".tflite") else model_dir, THRESHOLD_FILE)
    try:
        found = json.loads(fs.read_bytes(path))
        return float(found.get("threshold") or 0.0), str(found.get("how") or "")
    except Exception:  # noqa: BLE001 - missing, unreadable (a remote store's own errors) or not JSON: none
        return 0.0, "none"


def classify(model_dir: str, inputs: Iterable[Input], top: int = 1,
             max_pixels: int = MAX_PIXELS, threshold: float = 0.0) -> Iterator[Dict]:
    """One result per input, in order, as they are ready: {'path', 'predictions': [(class, probability)...],
    'ids', 'unsure'} or {'path', 'error'}.

    Streams: files are read as their batch fills (at most BATCH_BYTES of encoded images, 64 files),
    so memory does not grow with the number of inputs. The model is loaded at the first readable image.
    """
    serve = None
    inspected = (inspect_input(item, max_pixels) for item in inputs)
    batches = byte_batches(inspected, size=lambda result: len(result.get("data", b"")))
    for window in read_ahead(batches):
        images = [result for result in window if "data" in result]
        if images:
            serve = serve or load_serving(resolve_model_dir(model_dir))
            for result, labels in zip(images, label_batch(serve, [r.pop("data") for r in images], top, threshold)):
                result.update(labels)
        yield from window


def read_ahead(batches: Iterable[List]) -> Iterator[List]:
    """The batches, with the next one read (and checked) in a thread while the caller serves this one.

    Reading and Pillow's checks are one core's work and the model's call mostly another's; at most three
    batches (3 x BATCH_BYTES) are held. An exception in the reader is raised here, at the batch it stopped.
    """
    ready: "queue.Queue" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer is gone

    def read():
        try:
            for batch in batches:
                if not offer(("batch", batch)):
                    return
            offer(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            offer(("error", e))

    reader = threading.Thread(target=read, name="predict-read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            kind, item = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (an error, Ctrl-C): the reader ends at its next batch


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


def json_record(result: Dict, top: int = 0) -> str:
    """A result as one JSONL line (no newline): path, then predictions [{class, probability}] (the first `top`;
    0: all) and unsure (the best is below the model's confidence threshold), or error."""
    record = {"path": result["path"]}
    if "error" in result:
        record["error"] = result["error"]
    else:
        record["predictions"] = [{"class": name, "probability": round(p, 6)}
                                 for name, p in result["predictions"][:top or None]]
        record["unsure"] = bool(result.get("unsure"))
    return json.dumps(record, ensure_ascii=False)


MIME_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".gif": "image/gif",
              ".bmp": "image/bmp", ".webp": "image/webp"}


def automl_record(result: Dict, threshold: float) -> str:
    """A result in Vertex AutoML's batch prediction shape (one JSONL line): instance {content, mimeType} and
    prediction {ids, displayNames, confidences}, the classes at or above the confidence threshold, best first
    (none when the model is unsure); an input that failed has error {message} instead."""
    record: Dict = {"instance": {"content": result["path"], "mimeType": MIME_TYPES.get(
        os.path.splitext(result["path"])[1].lower(), "application/octet-stream")}}
    if "error" in result:
        record["error"] = {"message": result["error"]}
    else:
        kept = [(j, name, p) for j, (name, p) in zip(result["ids"], result["predictions"]) if p >= threshold]
        record["prediction"] = {"ids": [str(j) for j, _, _ in kept], "displayNames": [n for _, n, _ in kept],
                                "confidences": [round(p, 6) for _, _, p in kept]}
    return json.dumps(record, ensure_ascii=False)


def csv_header(top: int) -> List[str]:
    return ["path", *[f"{name}_{rank}" for rank in range(1, top + 1) for name in ("class", "probability")],
            "unsure", "error"]


def csv_cells(result: Dict, top: int) -> List[str]:
    """A result as a CSV row under csv_header(top): empty class/probability cells where there are fewer."""
    cells = [value for name, p in result.get("predictions", [])[:top] for value in (name, f"{p:.6f}")]
    unsure = "" if "error" in result else ("yes" if result.get("unsure") else "no")
    row = [result["path"], *cells, *[""] * (2 * top - len(cells)), unsure, result.get("error", "")]
    return [spreadsheet_safe(cell) for cell in row]  # names are the user's (or an attacker's): never formulas


def output_kind(path: str, option: str = "--output") -> str:
    """'.jsonl' or '.csv' from a results file's name; else InputError (--automl-output: .jsonl only)."""
    kind = os.path.splitext(path)[1].lower()
    if option == "--automl-output" and kind != ".jsonl":
        raise InputError(f"--automl-output {path}: name a .jsonl file (AutoML's batch prediction output is JSON Lines)")
    if kind not in (".jsonl", ".csv"):
        raise InputError(f"{option} {path}: name a .jsonl or .csv file")
    return kind


class Progress:
    """How far a long prediction run is, on one stderr line: rewritten in place on a terminal, else a
    new line every `every` seconds (logs). Nothing for runs shorter than `every`."""

    def __init__(self, stream, total: Optional[int] = None, every: float = 30.0):
        self._stream, self._total, self._every = stream, total, every
        self._tty = stream.isatty()
        self._start = self._last = time.monotonic()
        self._shown = False

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < (0.5 if self._tty else self._every):
            return
        if final and not self._shown:
            return
        self._last, self._shown = now, True
        rate = done / max(now - self._start, 1e-9)
        of = f"/{self._total:,} ({100 * done // max(self._total, 1)}%)" if self._total else ""
        line = f"{done:,}{of} inputs done, {rate:,.0f}/s"
        self._stream.write(("\r" + line + ("\n" if final else "")) if self._tty else line + "\n")
        self._stream.flush()


class ResultWriter:
    """Writes results to a .jsonl or .csv file as they come; the file has its name only once complete.
    A write that fails (a full disk) is one InputError naming --output, and leaves no partial file."""

    def __init__(self, path: str, top: int, automl_threshold: Optional[float] = None):
        """automl_threshold set: AutoML's batch prediction shape (automl_record) at that threshold."""
        kind = output_kind(path, "--output" if automl_threshold is None else "--automl-output")
        self._automl = automl_threshold
        self.path, self._partial = path, user_files.partial_path(path)
        try:
            self._file = open(self._partial, "w", newline="", encoding="utf-8")
        except OSError as e:
            raise InputError(f"--output {path}: cannot write there ({e.strerror or e})") from None
        self._csv = csv.writer(self._file) if kind == ".csv" else None
        self._top, self._closed = top, False
        if self._csv:
            self._guarded(self._csv.writerow, csv_header(top))

    def write(self, result: Dict) -> None:
        if self._automl is not None:
            self._guarded(self._file.write, automl_record(result, self._automl) + "\n")
        elif self._csv:
            self._guarded(self._csv.writerow, csv_cells(result, self._top))
        else:
            self._guarded(self._file.write, json_record(result, self._top) + "\n")

    def close(self, complete: bool) -> None:
        """Moves the file into place (complete), or removes it; once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.close()  # flushes: a full disk shows here
            if complete:
                os.replace(self._partial, self.path)
                return
        except OSError as e:
            user_files.discard(self._partial)
            if complete:
                raise self._error(e) from None
            return
        user_files.discard(self._partial)  # never a partial result file under the final name

    def _guarded(self, write, *args) -> None:
        try:
            write(*args)
        except OSError as e:
            self.close(complete=False)
            raise self._error(e) from None

    def _error(self, e: OSError) -> "InputError":
        return InputError(f"--output {self.path}: cannot write the results ({e.strerror or e}); free space there "
                          "or give a path on a disk with room")
