"""The ingestion worker pool: results come back, failures surface with the worker's message."""

import os
import signal

import pytest

from components.example_gen.writing.worker_pool import WorkerError, WorkerPool


def test_tasks_run_in_separate_processes_and_failures_surface():
    pool = WorkerPool(2)
    try:
        pids = {pool.submit(os.getpid).result(timeout=60) for _ in range(8)}
        assert os.getpid() not in pids
        assert pool.submit(divmod, 17, 5).result(timeout=60) == (3, 2)
        with pytest.raises(WorkerError, match="invalid literal for int"):
            pool.submit(int, "not a number").result(timeout=60)
        assert pool.submit(divmod, 9, 2).result(timeout=60) == (4, 1)  # still serving after an error
    finally:
        pool.shutdown()


def test_a_dead_worker_is_reported_not_waited_for():
    pool = WorkerPool(1)
    try:
        pid = pool.submit(os.getpid).result(timeout=60)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="died"):
            pool.submit(os.getpid).result(timeout=60)
    finally:
        pool.shutdown()


def test_cancelling_drops_queued_work_and_stops_busy_workers():
    import time

    pool = WorkerPool(1)
    busy = pool.submit(time.sleep, 60)
    queued = pool.submit(os.getpid)
    while not busy.running():
        time.sleep(0.01)
    pool.shutdown(cancel=True)
    # The busy worker was killed, not waited for (a worker that finished its task exits with status 0).
    assert [proc.returncode for proc in pool._procs] == [-signal.SIGKILL]
    assert queued.cancelled()
    with pytest.raises(WorkerError):
        busy.result(timeout=1)
