"""The Tuner step: when it searches and when it reuses (plain Python), the search space, and real tuned runs
of the whole pipeline (`imagepipe run --tune N`, then a rerun that reuses the values), the report's Tuning
section checked in Chromium."""

import json
import os

import pytest
from browser import open_page
from commands import run_imagepipe
from conftest import image_bytes, write

from components.tuner import decision
from trainer import search as tuning
from trainer.hparams import HParams

ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")


def profile(**changes):
    hp = HParams(model=changes.pop("model", "cnn"), image_size=changes.pop("image_size", 32))
    base = dict(
        hp=hp,
        trials=5,
        pipeline="digits",
        classes=["cat", "dog"],
        train_counts={"cat": 100, "dog": 100},
        features=None,
        space=tuning.space_names(hp),
        space_version=tuning.SPACE_VERSION,
    )
    base.update(changes)
    return decision.profile(**base)


def decide(previous, current, mode="auto"):
    return decision.decide(mode, previous, current, max_class_drift=0.2, max_feature_drift=0.5)


def test_a_search_is_reused_until_what_it_searched_on_changes():
    searched = profile()
    assert decide(None, profile()) == (True, "no earlier search in this pipeline")
    assert decide(searched, profile()) == (False, "classes, class mix, set size and settings as when searched")
    assert decide(searched, profile(), mode="search") == (True, "asked to search")
    assert decide(searched, profile(train_counts={"cat": 110, "dog": 95})).search is False  # a few more images
    changed = {
        "the classes changed (added 'bird')": profile(classes=["bird", "cat", "dog"]),
        "the class mix drifted (L-infinity 0.250 > 0.200, at 'cat')": profile(train_counts={"cat": 150, "dog": 50}),
        "the training set changed size (200 -> 500 examples)": profile(train_counts={"cat": 250, "dog": 250}),
        "the number of trials changed (5 -> 20)": profile(trials=20),
        "the image size changed (32 -> 64)": profile(image_size=64),
        "the model changed (cnn -> mobilenet_v2)": profile(model="mobilenet_v2"),
        "the last search was another pipeline's (digits)": profile(pipeline="pets"),
        f"the search space's ranges changed ({tuning.SPACE_VERSION} -> {tuning.SPACE_VERSION + 1})": profile(
            space_version=tuning.SPACE_VERSION + 1
        ),
    }
    for reason, current in changed.items():
        assert decide(searched, current) == (True, reason)


def test_drifted_backbone_features_are_searched_again():
    hp = HParams(model="mobilenet_v2", image_size=32)
    before = {"fingerprint": "f1", "profile": {"mean": [0.0, 1.0], "std": [1.0, 1.0]}}
    searched = profile(model="mobilenet_v2", features=before, space=tuning.space_names(hp))
    same = profile(model="mobilenet_v2", features=before, space=tuning.space_names(hp))
    moved = profile(
        model="mobilenet_v2",
        space=tuning.space_names(hp),
        features={"fingerprint": "f1", "profile": {"mean": [1.0, 2.0], "std": [1.0, 1.0]}},
    )
    other_weights = profile(
        model="mobilenet_v2", space=tuning.space_names(hp), features={**before, "fingerprint": "f2"}
    )
    assert decide(searched, same).search is False
    assert decide(searched, moved) == (True, "the backbone features drifted (1.000 > 0.500)")
    assert decide(searched, other_weights).reason == "the backbone weights changed (f1 -> f2)"


def test_the_search_space_and_its_values_in_the_trainer_settings():
    import keras_tuner

    space = keras_tuner.HyperParameters()
    tuning.define(space, HParams(model="cnn"))
    assert sorted(space.values) == ["batch_size", "dropout", "head_units", "learning_rate"]
    assert space.values["dropout"] == 0.3 and space.values["learning_rate"] == 1e-3  # the defaults first
    transfer = keras_tuner.HyperParameters()
    tuning.define(transfer, HParams(model="mobilenet_v2", fine_tune_epochs=2))
    assert {"fine_tune_learning_rate", "fine_tune_layers"} <= set(transfer.values)
    assert "fine_tune_layers" not in tuning.space_names(HParams(model="mobilenet_v2"))  # no fine-tuning: no search
    tuned = tuning.apply(HParams(), {"learning_rate": 0.004, "head_units": 128, "dropout": 0.1, "unknown": 1})
    assert (tuned.learning_rate, tuned.head_units, tuned.dropout, tuned.batch_size) == (0.004, 128, 0.1, 64)
    with pytest.raises(ValueError, match=r"dropout 1.5 \(a hyperparameter the Tuner sets\)"):
        tuning.apply(HParams(), {"dropout": 1.5})


@pytest.fixture(scope="module")
def tuned_runs(tmp_path_factory, small_digits):
    """`imagepipe run --tune 3`, a plain rerun (reuses the search), and a rerun after a class was added."""
    from pipeline.config import SAMPLE_SCHEMA

    root = str(tmp_path_factory.mktemp("tuned"))
    args = [
        "run",
        "--root",
        root,
        "--data",
        small_digits,
        "--schema",
        SAMPLE_SCHEMA,
        "--epochs",
        "2",
        "--accuracy-threshold",
        "0",
        "--name",
        "digits-tuned",
        "--explanations",
        "0",  # nothing here reads them
        "--progress",
        "json",
    ]

    def run(*extra):
        done = run_imagepipe(*args, *extra, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1]

    return run("--tune", "3"), run(), root


def _details(finished, name):
    return next(c["details"] for c in finished["components"] if c["component"] == name)


@pytest.mark.slow
def test_a_tuned_run_trains_with_the_best_trial_and_a_rerun_reuses_it(tuned_runs):
    first, second, _ = tuned_runs
    search = _details(first, "Tuner")
    assert search["searched"] and search["reason"] == "asked to search" and len(search["results"]) == 3
    assert [r["trial"] for r in search["results"]] == [1, 2, 3]
    best = max(search["results"], key=lambda r: r["score"])
    assert search["best"] == best["values"] and search["best_score"] == best["score"]
    assert set(best["values"]) == {"learning_rate", "dropout", "head_units", "batch_size"}
    trainer = _details(first, "Trainer")
    assert trainer["tuned"] == best["values"]
    log = json.load(open(os.path.join(trainer["model_run"], "training.json")))
    assert {k: log["hparams"][k] for k in best["values"]} == best["values"]  # trained with the winner's values

    reused = _details(second, "Tuner")
    assert not reused["searched"] and reused["reason"] == "classes, class mix, set size and settings as when searched"
    assert reused["best"] == search["best"] and reused["results"] == search["results"]
    assert _details(second, "Trainer")["tuned"] == best["values"]


@pytest.mark.slow
def test_the_report_shows_the_trials_and_the_winner(tuned_runs):
    first, second, _ = tuned_runs
    check = """(() => ({sections: [...document.querySelectorAll('section')].map(s => s.id),
      rows: document.querySelectorAll('#tuning table tr').length,
      charts: document.querySelectorAll('#tuning svg polyline').length,
      text: document.querySelector('#tuning').innerText}))()"""
    seen = open_page("file://" + first["report"], check, os.path.join(ARTIFACTS, "report-tuning.png"))
    assert seen["errors"] == []
    page = seen["check"]
    assert page["sections"][:5] == ["summary", "data", "validation", "health", "tuning"]
    assert page["rows"] == 1 + 3 and page["charts"] == 2  # a row per trial; score and best-so-far curves
    assert "This run searched: 3 trials" in page["text"] and "best" in page["text"]
    again = open_page("file://" + second["report"], check, os.path.join(ARTIFACTS, "report-tuning-reused.png"))
    assert "This run reused the best values of the search of" in again["check"]["text"]


@pytest.mark.slow
def test_new_classes_search_again_and_retune_without_a_search_is_one_line(tuned_runs, tmp_path, small_digits):
    import shutil

    _, _, root = tuned_runs
    fresh = run_imagepipe("run", "--root", str(tmp_path), "--data", small_digits, "--retune", timeout=300)
    assert fresh.returncode == 2 and fresh.stderr.count("\n") == 1
    assert "--retune: pipeline" in fresh.stderr and "has not searched yet; give --tune N" in fresh.stderr

    grown = tmp_path / "grown"
    shutil.copytree(small_digits, grown)
    for n in range(30):
        write(grown / "x" / f"x-{n}.png", image_bytes("PNG", size=(8, 8), mode="L", seed=n))
    done = run_imagepipe(
        "run",
        "--root",
        root,
        "--data",
        str(grown),
        "--name",
        "digits-tuned",
        "--epochs",
        "2",
        "--accuracy-threshold",
        "0",
        "--gate",
        "warn",
        "--explanations",
        "0",
        "--progress",
        "json",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    finished = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1]
    again = _details(finished, "Tuner")
    assert again["searched"] and again["reason"] == "the classes changed (added 'x')" and len(again["results"]) == 3
