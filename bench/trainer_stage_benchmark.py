"""The Trainer alone, on the artifacts of a finished run, this checkout's against another's, side by side:

    python -m bench.trainer_stage_benchmark --root R --baseline bench/out/base --trial-minutes 30
    python -m bench.trainer_stage_benchmark --root R --measure [--code TREE]     # one fresh process, one JSON line

Each measurement is a fresh process running the stage's executor on the inputs and parameters of the root's last
Trainer execution (bench/kept_stage.py), with `--trial-minutes` as --auto-trial-minutes (a large budget lets --model
auto try every candidate, so that their memory is measured; the run's own budget when not given). The trees take
turns, `--rounds` times; the table gives each one's seconds (min/median/max), the process tree's peak, and what
training decided (each candidate's held-out figure, the kept one).
"""

import importlib
import json
import os
import shutil
import tempfile
import time

from bench.kept_stage import compare_in_turn, last_execution, stage_main


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
        # why each stopped early or was not tried, and the seconds its first epochs were estimated at
        "notes": {c["name"]: (c["note"], c.get("estimated")) for c in trials.get("candidates", [])},
        "kept": trials.get("kept", log["hparams"]["model"]),
    }


def compare(root: str, trees: dict, rounds: int, trial_minutes: float) -> None:
    """The trees in turn, `rounds` times, each in a fresh process; a table of seconds, peaks and decisions."""

    def trials(last: dict) -> str:
        return ", ".join(
            f"{n} {v:.3f} ({epochs} epochs, {s:.0f} s)" if v is not None else f"{n} not tried"
            for n, (v, epochs, s) in last["candidates"].items()
        )

    compare_in_turn(
        "bench.trainer_stage_benchmark",
        root,
        trees,
        rounds,
        ["--trial-minutes", str(trial_minutes)],
        ["candidates' held-out figure", "kept"],
        lambda last: [trials(last), last["kept"]],
    )


def main() -> None:
    stage_main(
        __doc__,
        lambda root, args: measure(root, args.trial_minutes),
        lambda root, trees, args: compare(root, trees, args.rounds, args.trial_minutes),
        lambda parser: parser.add_argument(
            "--trial-minutes", type=float, default=-1, help="--auto-trial-minutes (-1: the run's own)"
        ),
    )


if __name__ == "__main__":
    main()
