"""`imagepipe export --format onnx|coreml --out PATH`: a pushed model for another runtime (trainer/model_exports.py).

The model is the newest pushed one of --root/--name, or --model DIR: its pixel classifier (the SavedModel's
pixel_probabilities: float32 RGB pixels 0..255, resized to its input) is converted. The file (or the Core ML
package, a folder) is written aside and moved into place whole, and never over anything imagepipe did not write.
"""

import argparse
import os

from cli.common import config_from_args, existing_pipeline, quiet_logs
from pipeline.config import ConfigError
from storage import user_files
from trainer import model_exports

FORMATS = ("onnx", "coreml")


def _onnx_of_ours(head: bytes) -> bool:
    """An ONNX file imagepipe wrote: its producer_name (field 2, near the start) is trainer/model_exports.PRODUCER."""
    return b"\x12" + bytes([len(model_exports.PRODUCER)]) + model_exports.PRODUCER.encode() in head


ONNX_FILE = user_files.Kind("an ONNX model", _onnx_of_ours)
# A Core ML package is a folder: written as every folder imagepipe writes where the user points (user_files.
# FolderWriter): new or empty, or one this command wrote, in which only what it wrote is replaced.
COREML_PACKAGE = "coreml package"


def cmd_export(args: argparse.Namespace) -> int:
    if args.format not in FORMATS:
        raise ConfigError(f"--format {args.format!r}: use {' or '.join(FORMATS)}")
    config = config_from_args(args) if args.model_dir else existing_pipeline(args)
    out = _export_target(args)
    # the package's folder is made beside --out now: a folder that cannot be written to is one line before the
    # minutes-long conversion
    package = user_files.FolderWriter(out, "--out", COREML_PACKAGE) if args.format == "coreml" else None
    try:
        return _export(args, config, out, package)
    finally:
        if package is not None:
            package.close(complete=False)  # nothing, once it is in place


def _export(args: argparse.Namespace, config, out: str, package) -> int:
    from prediction import predict  # PIL (~0.1 s): not at the CLI's start-up, which imports this module

    quiet_logs(False)
    try:
        model_dir = predict.resolve_model_dir(args.model_dir or config.serving_dir)
    except (predict.ModelNotFound, predict.ModelUnusable) as e:
        raise ConfigError(str(e)) from None
    if model_dir.endswith(".tflite"):
        raise ConfigError(f"--model {model_dir}: a TFLite model; give the SavedModel folder it came with")
    threshold, _ = predict.model_threshold(model_dir)
    multi_label = predict.is_multi_label(threshold)
    frozen, size, names = _pixel_classifier(model_dir, args.format)
    size_bytes = _write_export(args, out, frozen, size, names, multi_label, package)
    print(
        f"{args.format}: {out} ({size_bytes / 2**20:.1f} MB) from {model_dir}: takes float32 RGB pixels 0..255 "
        f"resized to {size}x{size}"
        if args.format == "onnx"
        else f"coreml: {out} ({size_bytes / 2**20:.1f} MB) from {model_dir}: takes an RGB image of {size}x{size}; "
        f"{len(names)} class labels"
    )
    return 0


def _export_target(args: argparse.Namespace) -> str:
    """--out as an absolute local path, checked before the model loads: never over a file imagepipe did not write."""
    if "://" in args.out:
        raise ConfigError(f"--out {args.out}: a local path only; write it here, then copy it (gsutil cp -r)")
    out = os.path.abspath(args.out)
    if args.format == "coreml" and not out.endswith(".mlpackage"):
        raise ConfigError(
            f"--out {args.out}: a Core ML package is a folder named .mlpackage; give e.g. model.mlpackage"
        )
    if args.format == "onnx":
        user_files.check_target(out, "--out", ONNX_FILE)
    return out


def _pixel_classifier(model_dir: str, fmt: str):
    """The SavedModel's pixel classifier, frozen for conversion: (frozen, input size, class names); RGB only."""
    try:
        frozen, size, channels, names = model_exports.of_saved_model(model_dir, batch=1 if fmt == "coreml" else None)
    except model_exports.ExportError as e:
        raise ConfigError(f"--model {model_dir}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a damaged SavedModel: TensorFlow raises many types
        raise ConfigError(
            f"--model {model_dir}: cannot load the SavedModel ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}); give a model folder imagepipe pushed"
        ) from None
    if channels != 3:
        raise ConfigError(
            f"--model {model_dir}: a {channels}-channel model; ONNX and Core ML exports are made for "
            "RGB (3-channel) models only"
        )
    return frozen, size, names


def _write_export(args: argparse.Namespace, out: str, frozen, size: int, names, multi_label: bool, package) -> int:
    """The ONNX file or the Core ML package (into `package`, a user_files.FolderWriter), written aside and moved
    into place whole: its size in bytes."""
    try:
        if args.format == "onnx":
            content = model_exports.onnx_bytes(frozen, size, names, multi_label)
            user_files.write_whole(out, content, "--out", ONNX_FILE)
            size_bytes = len(content)
        else:
            staged = os.path.join(package.partial, ".package", os.path.basename(out))
            os.makedirs(os.path.dirname(staged))
            model_exports.write_coreml(frozen, size, names, multi_label, staged)
            for name in os.listdir(staged):  # coremltools makes the package's folder itself: its contents move up
                os.rename(os.path.join(staged, name), os.path.join(package.partial, name))
            os.rmdir(staged)
            os.rmdir(os.path.dirname(staged))
            size_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(package.partial) for f in fs)
            package.close(complete=True)
    except model_exports.ExportError as e:
        raise ConfigError(f"--format {args.format}: {e}") from None
    return size_bytes
