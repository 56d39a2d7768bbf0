"""Processes forked from a warm interpreter: a command of its own, without paying its imports again.

Test infrastructure, not a feature. A test that runs `imagepipe run` as a subprocess spends 5-10 s of
its CPU importing TensorFlow, TFX, Beam, TFT, TFDV and TFMA before the first component, and a predict
about 3 s importing TensorFlow; the offline Vertex job pays 4-5 s a task. Measured here: a small run
31.6 -> 26.5 s, a predict 3.4 -> 0.5 s.

A WarmInterpreter is a Python process that imports the given modules once, then, for each request,
forks a child that runs one command: a module as `python -m` runs it (runpy, as __main__), or an
entry point as a console script calls it (`cli.main:console_main`, what `imagepipe` is). The child is
a process of its own with the command's argv, working directory and environment, its output in files;
its exit status comes back. Its only inheritance is the imported modules, so a command sees what it
would see as a fresh process, with one caveat kept exact: an import may set environment variables
(TensorFlow Transform sets TF_USE_LEGACY_KERAS), so the child applies the differences between the
environment the test asked for and the one the interpreter started with, on top of what the imports
left, as a fresh process that made the same imports would have them.

Only the main thread is alive after these imports (a native helper thread or two of numpy's BLAS,
which handles fork), so forking is safe. One command at a time per interpreter: a test that needs two
commands at once (a lock held by one run while another waits) forks one and runs the other as the real
console script. A command can also be started without waiting (start_entry), for a test that reads its
output as it comes or sends it a signal: it is a process group of its own.
"""

import json
import os
import select
import signal
import subprocess
import sys
from typing import Dict, List, Optional

from pipeline.config import PROJECT_DIR

# The interpreter: imports its modules, then for each request line forks a child that runs one command.
_SERVER = r"""
import importlib, json, os, runpy, signal, sys, traceback
started_env = dict(os.environ)
for name in {modules!r}:
    importlib.import_module(name)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)  # a group of its own: a command past its time is killed with its children
            # Ctrl-C and SIGTERM as a shell gives them to a command, whatever the interpreter inherited (twice in a
            # whole suite, its commands ignored SIGINT: the review server and a run waiting for its turn hung)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT, signal.SIGTERM}})
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, request["log"] + ".stdout"), (2, request["log"] + ".stderr")):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            wanted = request["env"]
            for key in set(started_env) - set(wanted):
                os.environ.pop(key, None)
            os.environ.update({{k: v for k, v in wanted.items() if started_env.get(k) != v}})
            os.chdir(request["cwd"])
            sys.argv = list(request["argv"])
            try:
                if request.get("entry"):
                    module, function = request["entry"].split(":")
                    getattr(importlib.import_module(module), function)()
                else:
                    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            except BaseException:
                traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(json.dumps(pid), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""


class WarmInterpreter:
    """A Python process that has imported `modules`; each run forks it into one command's process."""

    def __init__(self, modules: List[str], env: Optional[Dict[str, str]] = None):
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER.format(modules=list(modules))],
            cwd=PROJECT_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._answers = b""  # read from the interpreter, not yet taken: its lines can arrive together
        self._running: Optional[int] = None  # the pid of a command started and not yet finished

    def _ask(self, request: dict, timeout: float) -> int:
        return self.finish(self._start(request), timeout)

    def _start(self, request: dict) -> int:
        if self._running is not None:  # left by a test that failed before waiting for it: ended here
            self._line(0) if self.ended() else self._kill(self._running)
            self._running = None
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()
        self._running = json.loads(self._line(60))
        return self._running

    @property
    def busy(self) -> bool:
        """Whether a command started with start_entry has not been finished yet."""
        return self._running is not None

    def ended(self) -> bool:
        """Whether the command started last has ended (its exit status is waiting to be read by finish)."""
        return self._has_line(0)

    def finish(self, child: int, timeout: float) -> int:
        """The exit status of the command started last (pid `child`), killed with its group after `timeout` s."""
        try:
            return json.loads(self._line(timeout))
        except TimeoutError:
            self._kill(child)
            raise
        finally:
            self._running = None

    def _kill(self, child: int) -> None:
        for kill in (os.killpg, os.kill):  # its group; or itself, if it has not made its group yet
            try:
                kill(child, signal.SIGKILL)
                break
            except ProcessLookupError:  # or it has ended meanwhile
                continue
        self._line(60)  # its exit status: the interpreter has reaped it and is ready for the next

    def _has_line(self, timeout: float) -> bool:
        while b"\n" not in self._answers:
            if not select.select([self._process.stdout], [], [], timeout)[0]:
                return False
            chunk = os.read(self._process.stdout.fileno(), 4096)
            assert chunk, f"the warm interpreter ended (exit status {self._process.wait()})"
            self._answers += chunk
        return True

    def _line(self, timeout: float) -> str:
        if not self._has_line(timeout):
            raise TimeoutError(f"no answer from the warm interpreter in {timeout} s")
        line, _, self._answers = self._answers.partition(b"\n")
        return line.decode()

    def run_module(
        self,
        module: str,
        args: List[str],
        log: str,
        env: Optional[Dict[str, str]] = None,
        cwd: str = PROJECT_DIR,
        timeout: float = 900,
    ) -> int:
        """`python -m module args...` in a fork; its output goes to log.stdout and log.stderr."""
        return self._ask(
            {
                "module": module,
                "argv": [module, *map(os.fspath, args)],
                "log": log,
                "env": dict(env or os.environ),
                "cwd": os.fspath(cwd),
            },
            timeout,
        )

    def run_entry(
        self,
        entry: str,
        argv: List[str],
        log: str,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: float = 900,
    ) -> int:
        """A console script's entry point ("module:function") with sys.argv = argv, in a fork."""
        return self.finish(self.start_entry(entry, argv, log, env, cwd), timeout)

    def start_entry(
        self, entry: str, argv: List[str], log: str, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None
    ) -> int:
        """run_entry without waiting: the command's pid (the leader of its own process group, so it can be
        signalled or killed with its children); finish() waits for it, and no other command can start before."""
        return self._start(
            {
                "entry": entry,
                "argv": [os.fspath(a) for a in argv],
                "log": log,
                "env": dict(env or os.environ),
                "cwd": os.fspath(cwd or os.getcwd()),
            }
        )

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=60)
        self._process.stdout.close()
