"""DataHealth alone, on the artifacts of a finished run: its seconds, the peak memory of its process tree, and its
findings, so two versions of the stage can be compared on the same inputs, side by side.

    python -m bench.health_stage_benchmark --root bench/out/scale/root-final-10000
    python -m bench.health_stage_benchmark --root ... --code /tmp/old     # another checkout's stage (git worktree)

The inputs and parameters are those of the root's last DataHealth execution (read from its ML Metadata); the
output goes to a fresh folder under /tmp. One JSON line: seconds, peak_gb (RSS of this process and its children,
sampled five times a second), examples, label_issues, outliers, label_check_sampled, and the executor module's file
(which tree ran).
"""

import argparse
import importlib
import json
import os
import tempfile
import time

from bench.kept_stage import last_execution, use_code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--code", default="", help="another checkout's tree whose stage to run (else this one's)")
    args = parser.parse_args()
    if args.code:  # before any of the project's modules is imported
        use_code(args.code)
    from tfx.dsl.components.base import base_beam_executor

    from bench.scale_benchmark import TreeSampler
    from storage.artifact_types import DataHealthReport

    executor = importlib.import_module("components.health.executor")
    inputs, properties = last_execution(args.root, "DataHealth")
    out = tempfile.mkdtemp(prefix="health-stage-")
    health = DataHealthReport()
    health.uri = out
    context = base_beam_executor.BaseBeamExecutor.Context(
        beam_pipeline_args=[], tmp_dir=os.path.join(out, ".tmp"), unique_id="bench"
    )
    sampler = TreeSampler(os.getpid())
    sampler.start()
    started = time.monotonic()
    executor.Executor(context).Do(inputs, {"health": [health]}, properties)
    seconds = time.monotonic() - started
    sampler.stop()
    with open(os.path.join(out, "health.json")) as f:
        result = json.load(f)
    print(
        json.dumps(
            {
                "code": executor.__file__,
                "seconds": round(seconds, 1),
                "peak_gb": round(sampler.peak() / 1e9, 2),
                "examples": result["examples"],
                "label_issues": result["label_issues"],
                "outliers": result["outliers"],
                "label_check_sampled": result.get("label_check_sampled"),
            }
        )
    )


if __name__ == "__main__":
    main()
