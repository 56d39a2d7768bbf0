"""Benchmarks: `python -m bench.ingest_benchmark`, `python -m bench.input_benchmark`."""

import json
import os
import subprocess
import sys
import time


def measure_in_fresh_process(module: str, args: list) -> dict:
    """Runs `python -m module --measure ... args` in a new process (no warm imports or caches
    carried over); returns the JSON object it prints last, with its wall time as process_seconds."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.monotonic() - started
    return result


def examplegen_package(code_dir: str) -> str:
    """ImageExampleGen's package in the code at `code_dir` (a baseline commit's worktree, or this checkout):
    components.example_gen, or components.image_example_gen in commits before the move to a folder per stage (issue 41)."""
    moved = os.path.isdir(os.path.join(code_dir, "components", "example_gen"))
    return "components.example_gen" if moved else "components.image_example_gen"
