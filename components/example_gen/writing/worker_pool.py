"""A minimal process pool whose workers start as `python -m components.example_gen.writing.worker_pool`.

multiprocessing's spawn and forkserver re-import the caller's `__main__`, so a
user's script without an `if __name__ == "__main__":` guard would run its whole
pipeline again in every worker; fork is unsafe in a process that holds
TensorFlow's threads. These workers import only what the task function needs.

Tasks are module-level functions and picklable arguments; each worker serves
one task at a time over its stdin/stdout pipes.
"""

import concurrent.futures
import os
import pickle
import queue
import subprocess
import sys
import threading
import traceback
from typing import Callable, List


class WorkerError(RuntimeError):
    """A task failed in a worker (the message carries the worker's traceback)."""


class WorkerPool:
    def __init__(self, processes: int):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._tasks: "queue.Queue" = queue.Queue()
        self._procs = [
            subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            for _ in range(processes)
        ]
        self._threads: List[threading.Thread] = []
        for proc in self._procs:
            thread = threading.Thread(target=self._serve, args=(proc,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.put((future, fn, args))
        return future

    def _serve(self, proc: subprocess.Popen) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                pickle.dump((fn, args), proc.stdin)
                proc.stdin.flush()
                ok, value = pickle.load(proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                future.set_exception(
                    WorkerError(f"ingestion worker process {proc.pid} died (exit code {proc.poll()}); see its stderr")
                )
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(WorkerError(value))

    def shutdown(self, cancel: bool = False) -> None:
        """Stops the workers. cancel=True drops queued tasks and kills busy workers (after a failure)."""
        if cancel:
            while True:
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for proc in self._procs:
                proc.kill()  # a serving thread blocked on its pipe then sees end of file
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()
        for proc in self._procs:
            try:
                proc.stdin.close()  # the worker exits at end of input
            except OSError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def _worker_main() -> None:
    results = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    tasks = sys.stdin.buffer
    while True:
        try:
            fn, args = pickle.load(tasks)
        except EOFError:
            return
        try:
            reply = (True, fn(*args))
        except Exception as e:  # reported to the parent, which raises it
            reply = (False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        pickle.dump(reply, results)
        results.flush()


if __name__ == "__main__":
    _worker_main()
