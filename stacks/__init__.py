"""The two supported stacks, and every place where the code must differ between them.

    modern   TFX 1.21, TensorFlow 2.21, Keras 3.15, Beam 2.77, Python 3.12 or 3.13 (glibc 2.39+), modern.lock
    legacy   TFX 1.16, TensorFlow 2.16, Keras 3.12, Beam 2.61, Python 3.10 (any glibc), legacy.lock

The rest of the code is written once for both: TFMA's settings through `tensorflow_model_analysis.proto.config_pb2`
(both have it; 0.52 dropped the top-level names), TensorBoard an explicit dependency (TF 2.21 dropped it), numpy and
protobuf calls that both majors keep. Beside this file: the locks, debian_root.sh (a Debian 13 root for the modern
stack where the glibc is older) and in_root.sh (a command run inside it). Imports nothing of the project, nor
TensorFlow: the CLI reads it before loading anything heavy.
"""

import contextlib
import importlib.abc
import importlib.util
import os
import platform
import sys
import tempfile
from importlib import metadata

# Which stack this interpreter runs: TFX 1.21 needs Python 3.12+ here (its [kfp] extra stops below 3.12, and the
# lock is made for 3.12 and 3.13); TFX 1.16 needs Python < 3.11.
NAME = "modern" if sys.version_info >= (3, 12) else "legacy"

# Beam's in-process runner for `imagepipe predict --workers`, named there. Beam 2.70+'s DirectRunner first tries
# PrismRunner, which it downloads from the internet (offline it fails at once and falls back to FnApiRunner): the modern
# stack names FnApiRunner, by its full name (Beam 2.61 knows no short one). The DAG's own Beam steps name no runner:
# naming one, any one, made ImageExampleGen 1.7-2x as slow on both stacks (1,005 files, work seconds 1.56 -> 2.63 on
# the modern stack, 1.54-1.76 -> 2.95-3.17 on the legacy one). The likely cause, found since: given any Beam argument,
# TFX's Beam executors built a package of TFX (2.4 s a step), which components/beam_dependencies.py now stops for a
# runner on this machine; naming a runner has not been measured again.
FN_API_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
LOCAL_BEAM_RUNNER = FN_API_RUNNER if NAME == "modern" else "DirectRunner"
# The names of Beam's in-process runners (ours, and a user's --beam-arg --runner=...).
IN_PROCESS_BEAM_RUNNERS = ("DirectRunner", "direct", "FnApiRunner", FN_API_RUNNER)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe() -> str:
    """One line: the stack and what it is made of, e.g. 'modern stack: TFX 1.21.0, TensorFlow 2.21.0, Python 3.13.5'."""
    return (
        f"{NAME} stack: TFX {_version('tfx')}, TensorFlow {_version('tensorflow')}, Python {platform.python_version()}"
    )


# TensorFlow 2.17+ logs through absl before absl's logging is set up, which TF_CPP_MIN_LOG_LEVEL does not reach
# (tensorflow/tensorflow#100442): every process that imports it prints these on standard error. TF 2.16 honours the
# variable, so on the legacy stack nothing matches.
_START_UP_NOTICES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "port.cc:153] oneDNN custom operations are on",
    "cudart_stub.cc:31] Could not find cuda drivers on your machine",
)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Runs TensorFlow's first import with standard error (the file descriptor, where C++ writes) in a temporary
    file, then writes back every line but the start-up notices: an import error still shows whole."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            execute = spec.loader.exec_module

            def exec_module(module):
                with _stderr_without(_START_UP_NOTICES):
                    execute(module)

            spec.loader.exec_module = exec_module
        return spec


@contextlib.contextmanager
def _stderr_without(notices):
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(notice in line for notice in notices):
                    sys.stderr.write(line)
            sys.stderr.flush()


def quiet_tensorflow_start() -> None:
    """Drops TensorFlow's start-up notices from this process's standard error (for commands not run --verbose);
    call it before TensorFlow is imported. Nothing else TensorFlow logs is hidden."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
