"""Decisions made on held-out train data (trainer/holdout.py, trainer/operating_point.py): nothing the Trainer
chooses reads the eval split, which is left to the Evaluator."""

import json
import os

import pytest
from PIL import Image

from pipeline import local_runner
from pipeline.config import PipelineConfig

pytestmark = pytest.mark.slow  # whole pipeline runs


def _details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


def _presplit(source, target, wrong_eval: bool):
    """24 train and 6 eval digits a class, enlarged to 96 px (photo-sized: --model auto compares its candidates,
    trainer/model_trials.py); with wrong_eval, each eval file (the same path) holds the image of the same place in
    the next class: every eval label is wrong, and nothing else about the listing changes (the ingest order follows
    the paths)."""
    classes = sorted(d for d in os.listdir(source) if not d.startswith("."))
    for i, label in enumerate(classes):
        names = sorted(os.listdir(os.path.join(source, label)))
        other = classes[(i + 1) % len(classes)]
        others = sorted(os.listdir(os.path.join(source, other)))
        for split, chosen in (("train", range(24)), ("eval", range(24, 30))):
            os.makedirs(os.path.join(target, split, label), exist_ok=True)
            for n in chosen:
                taken = os.path.join(source, other, others[n]) if split == "eval" and wrong_eval else None
                with Image.open(taken or os.path.join(source, label, names[n])) as image:
                    image.convert("RGB").resize((96, 96), Image.NEAREST).save(
                        os.path.join(target, split, label, names[n])
                    )


def test_the_trainer_never_reads_the_eval_split(tmp_path, small_digits):
    """The same train split with two eval splits, one of them labelled wrongly throughout: the Trainer's epochs,
    kept epoch, held-out images and operating point are the same to the bit; only the Evaluator's figures differ."""
    runs = {}
    for name, wrong in (("right", False), ("wrong", True)):
        data = tmp_path / f"{name}-data"
        _presplit(small_digits, data, wrong)
        config = PipelineConfig(
            # One root, two pipelines (their data differ): the second run's images are all the first's, so its
            # features come from the root's cache (stored as computed) and its backbone is never loaded.
            root=str(tmp_path / "root"),
            data=str(data),
            image_size=32,
            epochs=4,
            accuracy_threshold=0.0,
            min_class_recall=0.0,
            explanations=0,  # what the Evaluator adds after TFMA reads only the eval split (5-7 s a run here)
        )
        summary = local_runner.run(config)
        with open(os.path.join(_details(summary, "Trainer")["model_run"], "training.json")) as f:
            runs[name] = (json.load(f), _details(summary, "Evaluator"))

    (right, right_eval), (wrong, wrong_eval) = runs["right"], runs["wrong"]
    assert right["held_out"]["held_out_examples"] == 10 * 5  # a fifth of 24 a class, rounded: 5
    assert right["held_out"]["train_examples"] == 10 * 19
    assert right["held_out"] == wrong["held_out"]
    metrics = lambda log: [{k: v for k, v in e.items() if k != "seconds"} for e in log["epochs"]]  # noqa: E731
    assert metrics(right) == metrics(wrong)
    assert right["operating_point"] == wrong["operating_point"]
    # --model auto's candidates were compared on the same held-out images, alike (their seconds and estimates aside)
    timed = ("seconds", "estimated")
    candidates = lambda log: [{k: v for k, v in t.items() if k not in timed} for t in log["model_trials"]["candidates"]]  # noqa: E731
    assert [t["name"] for t in candidates(right)] == ["head", "cnn", "fine-tuned"]
    # the two costlier ones were estimated first (their pace probed), within what the budget left
    trials = right["model_trials"]["candidates"]
    assert trials[0]["estimated"] == 0 and all(0 < t["estimated"] < 600 for t in trials[1:]), trials
    assert all(t["figure"] is not None for t in candidates(right)), candidates(right)
    # each one's held-out figure after every epoch it trained, its kept figure the best of them
    assert all(len(t["curve"]) == t["epochs"] and max(t["curve"]) == t["figure"] for t in candidates(right))
    assert candidates(right) == candidates(wrong) and right["hparams"] == wrong["hparams"]
    # ... while the eval splits did differ: the wrongly labelled one scores near zero
    assert right_eval["accuracy"] > 0.5 and wrong_eval["accuracy"] < 0.3
    # the kept epoch's held-out accuracy is the one the operating point's argmax measured, image for image
    kept = max(right["epochs"], key=lambda e: (e["val_sparse_categorical_accuracy"], -e["val_loss"]))
    held = right["operating_point"]["model_on_held_out"]
    assert kept["val_sparse_categorical_accuracy"] == pytest.approx(held["argmax"]["accuracy"], abs=1.01 / 50)
