"""The Evaluator alone, on the artifacts of a finished run, this checkout's against another's, side by side:

    python -m bench.evaluator_stage_benchmark --root R --baseline bench/out/base   # R: a finished run's root
    python -m bench.evaluator_stage_benchmark --root R --measure [--code TREE]     # one fresh process, one JSON line

Each measurement is a fresh process running the stage's executor on the inputs and parameters of the root's last
Evaluator execution (bench/kept_stage.py), with the eval config that tree's pipeline would compile (so a change of
metrics is measured) and `--explanations` eval images explained (0 by default: TFMA's part and the pass that
records the misclassified eval images, components/evaluator/misclassified.py; a tree before a122aca has no such
pass). The trees take turns, `--rounds` times; the table gives each one's seconds (min/median/max), the process
tree's peak, and what the evaluation says (accuracy, cross-entropy, eval images, blessed), which must agree.
"""

import importlib
import os
import shutil
import tempfile
import time

from bench.kept_stage import compare_in_turn, last_execution, stage_main


def measure(root: str, explanations: int) -> dict:
    """Runs the Evaluator once in this process; its seconds, peak and findings."""
    import tensorflow_model_analysis as tfma
    from tfx.dsl.components.base import base_beam_executor
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from bench.scale_benchmark import TreeSampler

    executor = importlib.import_module("components.evaluator.executor")
    settings = importlib.import_module("components.evaluator.eval_config")
    inputs, properties = last_execution(root, "Evaluator")
    config = settings.eval_config(properties.get(settings.THRESHOLD, 0.0), properties.get(settings.CONFIDENCE))
    properties.update(eval_config=proto_utils.proto_to_json(config), **{settings.EXPLANATIONS: explanations})
    out = tempfile.mkdtemp(prefix="evaluator-stage-")  # removed below: nothing is written beside the run
    evaluation, blessing = standard_artifacts.ModelEvaluation(), standard_artifacts.ModelBlessing()
    evaluation.uri, blessing.uri = os.path.join(out, "evaluation"), os.path.join(out, "blessing")
    context = base_beam_executor.BaseBeamExecutor.Context(
        beam_pipeline_args=[], tmp_dir=os.path.join(out, ".tmp"), unique_id="bench"
    )
    sampler = TreeSampler(os.getpid())
    sampler.start()
    started = time.monotonic()
    executor.Executor(context).Do(inputs, {"evaluation": [evaluation], "blessing": [blessing]}, properties)
    seconds = time.monotonic() - started
    sampler.stop()
    found = {
        kv.key.name: kv.value.double_value.value
        for metrics in tfma.load_metrics(evaluation.uri)
        if not metrics.slice_key.single_slice_keys
        for kv in metrics.metric_keys_and_values
        if not kv.key.HasField("sub_key") and not kv.key.is_diff and kv.key.model_name in ("", "candidate")
    }
    shutil.rmtree(out, ignore_errors=True)
    return {
        "code": executor.__file__,
        "seconds": round(seconds, 2),
        "peak_gb": round(sampler.peak() / 1e9, 2),
        "eval_images": int(found.get("example_count", 0)),
        "accuracy": found.get("sparse_categorical_accuracy"),
        "cross_entropy": found.get("sparse_categorical_crossentropy"),
        "blessed": blessing.get_int_custom_property("blessed"),
    }


def compare(root: str, trees: dict, rounds: int, explanations: int) -> None:
    """The trees in turn, `rounds` times, each in a fresh process; a table of seconds and what each found."""
    compare_in_turn(
        "bench.evaluator_stage_benchmark",
        root,
        trees,
        rounds,
        ["--explanations", str(explanations)],
        ["eval images", "accuracy", "cross-entropy", "blessed"],
        lambda last: [
            str(last["eval_images"]),
            f"{last['accuracy']:.4f}",
            f"{last['cross_entropy']:.6f}",
            str(last["blessed"]),
        ],
    )


def main() -> None:
    stage_main(
        __doc__,
        lambda root, args: measure(root, args.explanations),
        lambda root, trees, args: compare(root, trees, args.rounds, args.explanations),
        lambda parser: parser.add_argument(
            "--explanations",
            type=int,
            default=0,
            help="eval images explained (0: none; the misclassified pass still runs)",
        ),
        rounds=3,
    )


if __name__ == "__main__":
    main()
