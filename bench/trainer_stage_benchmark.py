"""The Trainer alone, on the artifacts of a finished run, this checkout's against another's, side by side:

    python -m bench.trainer_stage_benchmark --root R --baseline bench/out/base --trial-minutes 30
    python -m bench.trainer_stage_benchmark --root R --measure [--code TREE]     # one fresh process, one JSON line

Each measurement is a fresh process running the stage's executor on the inputs and parameters of the root's last
Trainer execution (bench/kept_stage.py), with `--trial-minutes` as --auto-trial-minutes (a large budget lets --model
auto try every candidate, so that their memory is measured; the run's own budget when not given). The trees take
turns, `--rounds` times; the table gives each one's seconds (min/median/max), the process tree's peak, and what
training decided (each candidate's held-out figure, the kept one).
"""

import argparse
import importlib
import json
import os
import shutil
import statistics
import tempfile
import time

from bench import measure_in_fresh_process
from bench.kept_stage import last_execution, use_code


def measure(root: str, trial_minutes: float) -> dict:
    """Runs the Trainer once in this process; its seconds, peak and decisions."""
    from tfx.types import standard_artifacts

    from bench.scale_benchmark import TreeSampler

    component = importlib.import_module("components.trainer.component")
    inputs, properties = last_execution(root, "Trainer")
    if trial_minutes >= 0:
        config = json.loads(properties["custom_config"])
        config["auto_trial_minutes"] = trial_minutes
        properties["custom_config"] = json.dumps(config)
    out = tempfile.mkdtemp(prefix="trainer-stage-")  # removed below: nothing is written beside the run
    model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
    model.uri, model_run.uri = os.path.join(out, "model"), os.path.join(out, "model_run")
    sampler = TreeSampler(os.getpid())
    sampler.start()
    started = time.monotonic()
    component.TrainerExecutor().Do(inputs, {"model": [model], "model_run": [model_run]}, properties)
    seconds = time.monotonic() - started
    sampler.stop()
    with open(os.path.join(model_run.uri, "training.json")) as f:
        log = json.load(f)
    shutil.rmtree(out, ignore_errors=True)
    trials = log.get("model_trials") or {}
    return {
        "code": component.__file__,
        "seconds": round(seconds, 2),
        "peak_gb": round(sampler.peak() / 1e9, 2),
        "candidates": {c["name"]: (c["figure"], c["epochs"], c["seconds"]) for c in trials.get("candidates", [])},
        "kept": trials.get("kept", log["hparams"]["model"]),
    }


def compare(root: str, trees: dict, rounds: int, trial_minutes: float) -> None:
    """The trees in turn, `rounds` times, each in a fresh process; a table of seconds, peaks and decisions."""
    runs = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            args = ["--measure", "--root", root, "--trial-minutes", str(trial_minutes), "--code", tree]
            runs[name].append(measure_in_fresh_process("bench.trainer_stage_benchmark", args))
    print("| code | seconds (min / median / max) | peak GB | candidates' held-out figure | kept |")
    print("|---|---|---|---|---|")
    for name, found in runs.items():
        seconds = sorted(r["seconds"] for r in found)
        last = found[-1]
        shown = ", ".join(
            f"{n} {v:.3f} ({epochs} epochs, {s:.0f} s)" if v is not None else f"{n} not tried"
            for n, (v, epochs, s) in last["candidates"].items()
        )
        print(
            f"| {name} | {seconds[0]:.1f} / {statistics.median(seconds):.1f} / {seconds[-1]:.1f} "
            f"| {max(r['peak_gb'] for r in found):.2f} | {shown} | {last['kept']} |"
        )
    this, base = (statistics.median(r["seconds"] for r in found) for found in runs.values())
    print(f"this / baseline: {this / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a finished run's root (its metadata/ and artifacts)")
    parser.add_argument("--baseline", default="", help="another checkout's tree to compare with (a git worktree)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trial-minutes", type=float, default=-1, help="--auto-trial-minutes (-1: the run's own)")
    parser.add_argument("--measure", action="store_true", help="one measurement in this process, as one JSON line")
    parser.add_argument("--code", default="", help="with --measure: the checkout whose stage runs (else this one)")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.measure:
        if args.code:  # before any of the stage's modules is imported
            use_code(args.code)
        print(json.dumps(measure(root, args.trial_minutes)))
        return
    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    compare(root, {"this": this, "baseline": os.path.abspath(args.baseline)}, args.rounds, args.trial_minutes)


if __name__ == "__main__":
    main()
