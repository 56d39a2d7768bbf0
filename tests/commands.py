"""`imagepipe` commands as the tests run them: each a process of its own, forked from a warm interpreter.

Test infrastructure (tests/warm_interpreter.py does the forking): run_imagepipe, run_tfx (TFX's own CLI) and
run_pipeline_module run a command to its end, StartedCommand starts one a test signals or reads as it goes,
run_helper runs a function of a tests/ module in another environment.
"""

import os
import shutil
import sys
import tempfile

import vertex_offline

IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")  # the console script, as users run it


# `imagepipe COMMAND` forked from a warm interpreter that has imported what the command imports
# (tests/warm_interpreter.py): `run` (and the other commands that build the pipeline) loads TensorFlow,
# TFX, Beam, TFT, TFDV and TFMA (a small run 31.6 -> 26.5 s forked), the others TensorFlow and the
# prediction modules (a predict 3.4 -> 0.5 s). One interpreter of each kind per test process, and once the
# pipeline one is started it serves the other commands too (its imports are a superset); the offline
# Vertex job forks its tasks from it as well.
_OTHER_MODULES = [
    "tensorflow",
    "cli.main",
    "prediction.predict",
    "prediction.batch_predict",
    "prediction.image_inputs",
    "prediction.result_files",
    "runs.run_store",
    "runs.run_summary",
    "report.report",
]
_WARM_MODULES = {
    "pipeline": [
        vertex_offline.WARM_MODULE,
        "tfx.v1",
        "tfx.orchestration.local.local_dag_runner",
        "pipeline.local_runner",
        "pipeline.pipeline",
        "runs.progress",
        "runs.run_lock",
        *_OTHER_MODULES,
    ],
    "other": _OTHER_MODULES,
}
_warm = {}


PIPELINE_COMMANDS = ("run", "compile", "submit", "schedule")  # the commands that build the pipeline


def run_imagepipe(*args: str, cwd=None, env=None, timeout: float = 900):
    """`imagepipe ARGS` in a process of its own, as subprocess.run(capture_output=True, text=True) would give
    it: argv, working directory and environment as asked, output captured, exit status. The process is a fork
    of a warm interpreter calling the console script's entry point (cli.main:console_main), so it skips the
    imports; a test that needs two commands at once runs one of them as the console script itself."""
    return _console_script(_kind(args), "cli.main:console_main", [IMAGEPIPE, *args], cwd, env, timeout)


class StartedCommand:
    """`imagepipe ARGS` forked as run_imagepipe forks it, still running: its pid (a process group of its
    own, for signals), the lines of its standard output as they are written, and its end."""

    def __init__(self, args, cwd=None, env=None):
        self.args = [IMAGEPIPE, *args]
        self._warm = warm_interpreter(_kind(args))
        self._folder = tempfile.mkdtemp(prefix="imagepipe-command-")
        self._log = os.path.join(self._folder, "command")
        open(self._log + ".stdout", "w").close()  # there to read from the start (the command truncates it)
        self.pid = self._warm.start_entry("cli.main:console_main", self.args, self._log, env=env, cwd=cwd)
        self.returncode = None

    def lines(self, timeout: float = 600):
        """Its standard output, line by line as written, until it ends (or `timeout` s pass: AssertionError)."""
        import time

        deadline = time.monotonic() + timeout
        with open(self._log + ".stdout", errors="replace") as out:
            partial = ""
            while True:
                ended = self._warm.ended()  # before reading, so nothing written before the end is missed
                partial += out.readline()
                if partial.endswith("\n"):
                    yield partial
                    partial = ""
                elif ended:
                    return
                else:
                    assert time.monotonic() < deadline, f"{self.args[1:]} still running after {timeout} s"
                    time.sleep(0.05)

    def running(self) -> bool:
        return not self._warm.ended()

    def send_signal(self, sig) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 600):
        """Its end, as subprocess.run(capture_output=True, text=True) gives it."""
        try:
            self.returncode = self._warm.finish(self.pid, timeout)
            return _completed(self.args, self.returncode, self._log)
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)


def run_tfx(*args: str, cwd=None, env=None, timeout: float = 600):
    """`tfx ARGS` (TFX's own CLI, which runs the pipeline file in its process) as run_imagepipe runs a command: its
    console script's entry point in a fork of the pipeline interpreter, which has imported TFX (~11 s fresh)."""
    tfx = os.path.join(os.path.dirname(sys.executable), "tfx")
    return _console_script("pipeline", "tfx.tools.cli.cli_main:cli_group", [tfx, *args], cwd, env, timeout)


def run_pipeline_module(module: str, *args: str, cwd=None, env=None, timeout: float = 900):
    """`python -m MODULE ARGS` (a runner of the pipeline) as run_imagepipe runs a command."""
    return _forked(
        "pipeline",
        [sys.executable, "-m", module, *args],
        lambda warm, log: warm.run_module(module, list(args), log, env=env, cwd=cwd or os.getcwd(), timeout=timeout),
    )


def warm_interpreter(kind: str):
    """This test process's warm interpreter of `kind` (see _WARM_MODULES), started at the first use."""
    from warm_interpreter import WarmInterpreter

    if kind == "other" and "pipeline" in _warm and not _warm["pipeline"].busy:
        kind = "pipeline"  # it has imported what they import: one interpreter's imports fewer
    if kind not in _warm:
        # Imported as a command that is not --verbose imports them (cli/common.py quiet_logs): TensorFlow's C++
        # log level is read once, at its import.
        _warm[kind] = WarmInterpreter(_WARM_MODULES[kind], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return _warm[kind]


def run_helper(entry: str, *args: str, env=None, timeout: float = 900):
    """A function of a module in tests/ ("module:function", reading sys.argv) in a process of its own, as
    run_imagepipe runs a command: for a test that needs another environment (a fake Cloud Storage). It runs in
    tests/, which is how the module is found (the interpreter's path starts with its working directory)."""
    return _console_script("pipeline", entry, [entry, *args], os.path.dirname(os.path.abspath(__file__)), env, timeout)


def _kind(args) -> str:
    return "pipeline" if args and args[0] in PIPELINE_COMMANDS else "other"


def _console_script(kind: str, entry: str, argv, cwd, env, timeout: float):
    """A console script (argv[0]) run to its end as its entry point (module:function) in a fork of `kind`."""
    return _forked(kind, argv, lambda warm, log: warm.run_entry(entry, argv, log, env=env, cwd=cwd, timeout=timeout))


def _forked(kind: str, argv, run):
    folder = tempfile.mkdtemp(prefix="imagepipe-command-")
    try:
        log = os.path.join(folder, "command")
        return _completed(argv, run(warm_interpreter(kind), log), log)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _completed(argv, code: int, log: str):
    """What subprocess.run(capture_output=True, text=True) returns, from a forked command's log files."""
    import subprocess

    with open(log + ".stdout", errors="replace") as out, open(log + ".stderr", errors="replace") as err:
        return subprocess.CompletedProcess(argv, code, out.read(), err.read())


def close_all() -> None:
    """Ends this test process's warm interpreters (at the end of its session)."""
    for interpreter in _warm.values():
        interpreter.close()
    _warm.clear()
