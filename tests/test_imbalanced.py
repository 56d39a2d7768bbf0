"""Imbalanced classes through the whole DAG: the class mix seen at ingestion, data health's warnings, the gate on
every class (a model that misses a class is never blessed), and the summary, report and model card that say so."""

import json
import os
import re

import pytest
from conftest import image_bytes, write

from pipeline import local_runner
from pipeline.config import PipelineConfig
from report import report
from runs import run_text, verdicts

pytestmark = pytest.mark.slow  # a whole pipeline run (make test-fast leaves it out)

COUNTS = {"ok": 400, "defect": 50, "rare": 8}


@pytest.fixture(scope="module")
def majority_only(tmp_path_factory):
    """Noise images in three classes (nothing to learn: a model can only follow the mix), trained without class
    balancing: a model that calls everything `ok`, at an accuracy over the threshold of 0.5. Blessed first with
    --min-class-recall 0 (no class judged), then judged again by default, against that blessed model."""
    data = tmp_path_factory.mktemp("imbalanced") / "data"
    for c, (label, n) in enumerate(COUNTS.items()):
        for i in range(n):
            write(data / label / f"{i}.png", image_bytes("PNG", size=(16, 16), seed=c * 10_000 + i))
    config = PipelineConfig(
        root=str(tmp_path_factory.mktemp("root")),
        data=str(data),
        image_size=16,
        epochs=3,
        class_balance="off",
        operating_point="argmax",  # the head's own decision: no offsets chosen to reach the rare classes
        accuracy_threshold=0.5,
        min_class_recall=0.0,
        explanations=0,  # nothing here reads them
    )
    first = local_runner.run(config)
    assert _details(first, "Evaluator")["blessed"] and _details(first, "Pusher")["pushed"]
    config.min_class_recall = PipelineConfig.min_class_recall
    return config, local_runner.run(config)


def _details(summary, name):
    return next(c["details"] for c in summary["components"] if c["component"] == name)


def _line(summary, name):
    return next(line for line in run_text.format_summary(summary) if line.split()[0] == name)


def test_ingestion_keeps_every_class_in_eval_and_states_the_mix(majority_only):
    _, summary = majority_only
    ingest = _details(summary, "ImageExampleGen")
    assert ingest["examples_per_split_and_class"]["eval"] == {"ok": 80, "defect": 10, "rare": 2}  # 20% of each
    assert ingest["imbalance_ratio"] == 320 / 6
    assert ingest["classes_with_few_eval_examples"] == ["rare"]
    assert "imbalanced 53.3:1 in train: ok 320 (87.4%), defect 40 (10.9%), rare 6 (1.6%)" in _line(
        summary, "ImageExampleGen"
    )
    health = _details(summary, "DataHealth")
    assert [w["check"] for w in health["warnings"]] == ["class imbalance", "few eval images"]
    assert health["warnings"][1]["classes"] == ["rare"]
    assert "1 class with fewer than 10 eval images, too few to judge the model on: rare (2)" in _line(
        summary, "DataHealth"
    )


def test_a_model_that_misses_a_class_is_not_blessed_and_the_line_names_the_class(majority_only):
    config, summary = majority_only
    log = _details(summary, "Trainer")
    assert log["class_balance"]["mode"] == "off" and log["class_balance"]["imbalanced"]
    assert log["monitor"] == "val_balanced_accuracy"  # the kept epoch follows balanced accuracy
    evaluation = _details(summary, "Evaluator")
    assert evaluation["accuracy"] >= 0.5 and not evaluation["blessed"]
    assert evaluation["per_class"]["ok"]["recall"] > 0.9 and evaluation["per_class"]["defect"]["recall"] < 0.5
    failures = [f for f in evaluation["failures"] if "defect" in f]
    assert len(failures) == 1 and re.fullmatch(
        r"class 'defect' recall 0\.\d\d < 0\.50 \(10 eval images\) \(--min-class-recall\)", failures[0]
    )
    assert not any("rare" in f for f in evaluation["failures"])  # 2 eval images: not judged
    line = _line(summary, "Evaluator")
    assert "balanced accuracy" in line and "not blessed: " in line and failures[0] in line
    assert _details(summary, "Pusher") == {"pushed": False, "destination": ""}
    assert len(os.listdir(config.serving_dir)) == 1  # the first run's model only
    # Compared with the last blessed model on balanced accuracy (the train split is imbalanced): not below it.
    assert evaluation["gate"]["compared_on"] == "balanced_accuracy"
    assert evaluation["baseline_balanced_accuracy"] == pytest.approx(evaluation["balanced_accuracy"], rel=1e-6)
    assert "last blessed model: balanced accuracy" in line


def test_the_card_and_the_report_show_every_class(majority_only, tmp_path):
    _, summary = majority_only
    card = _details(summary, "ModelCard")
    with open(card["card_json"]) as f:
        evaluation = json.load(f)["evaluation"]
    assert evaluation["balanced_accuracy"] == pytest.approx(_details(summary, "Evaluator")["balanced_accuracy"])
    assert (
        evaluation["class_gate"]["judged"] == ["defect", "ok"] and evaluation["class_gate"]["min_class_recall"] == 0.5
    )
    assert evaluation["weakest_class"]["name"] in ("defect", "rare") and not evaluation["blessed"]
    with open(card["card_md"]) as f:
        markdown = f.read()
    assert "balanced accuracy (mean recall of the classes)" in markdown and "weakest class" in markdown
    assert "largest / smallest class in train 53.3:1 (imbalanced)" in markdown
    page = open(report.build(summary, str(tmp_path / "report.html"))).read()
    for text in (
        "Every class",
        "each row as shares of its class",
        "imbalanced 53.3:1 in train",
        "too few eval images",
        "held-out balanced accuracy",
    ):
        assert text in page, text
    kind, verdict = verdicts.model_verdict(summary)
    assert kind == "bad" and "balanced accuracy" in verdict and "weakest class" in verdict
