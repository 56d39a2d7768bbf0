"""The operating point and the calibration (trainer/operating_point.py), on held-out predictions drawn to look like
the cases that made them necessary: a class-weighted head whose argmax calls a quarter of the good parts defective,
several rare classes at chance, an overconfident model."""

import numpy as np
import pytest

from trainer import operating_point


def _scores(rng, labels, separation, bias, classes):
    """Log-probabilities of a model that ranks well (each image's own class `separation` higher, plus noise) but
    whose decision boundary is moved by `bias` (per class, added to every image)."""
    logits = rng.normal(0.0, 1.0, (len(labels), classes)) + np.asarray(bias)
    logits[np.arange(len(labels)), labels] += separation
    return operating_point.softmax(logits)


def test_a_moved_boundary_is_moved_back_to_meet_the_gate():
    rng = np.random.default_rng(0)
    labels = np.array([0] * 400 + [1] * 12)  # ok, defect: a held-out fifth of a 2%-defect train split
    probabilities = _scores(rng, labels, 3.0, [0.0, 2.5], 2)  # the weighted loss favours "defect"
    argmax = operating_point.figures(labels, probabilities.argmax(1), 2)
    assert argmax["accuracy"] < 0.9  # as on the kept defect set: too many good parts called defective

    decision = operating_point.choose(probabilities, labels, ["ok", "defect"], "auto", 0.9, 0.5)

    chosen = decision["held_out"]["chosen"]
    assert decision["meets"] and decision["reason"] == ""
    assert chosen["accuracy"] >= 0.9 and min(chosen["recall"]) >= 0.5
    assert chosen["balanced_accuracy"] > argmax["balanced_accuracy"]
    # folded into a last layer, the offsets and temperature decide the same way
    kernel, bias = np.eye(2), np.zeros(2)
    folded_kernel, folded_bias = operating_point.fold(kernel, bias, decision["offsets"], decision["temperature"])
    logits = operating_point.log_probabilities(probabilities)
    deployed = operating_point.softmax(logits @ folded_kernel + folded_bias)
    assert (deployed.argmax(1) == (logits + decision["offsets"]).argmax(1)).all()
    assert operating_point.figures(labels, deployed.argmax(1), 2) == chosen
    # each class's precision-recall curve on the held-out images, and the chosen rule's point on it
    curves = decision["held_out"]["precision_recall"]
    assert sorted(curves) == ["defect", "ok"]
    assert [c["chosen"][0] for c in curves.values()] == pytest.approx(
        sorted(chosen["recall"]), abs=1e-4
    )  # the lowest chosen recall first
    defect = curves["defect"]
    assert defect["chosen"][0] == pytest.approx(chosen["recall"][1], abs=1e-4)  # kept to 4 places
    predicted = (logits + decision["offsets"]).argmax(1) == 1
    assert defect["chosen"][1] == pytest.approx((labels[predicted] == 1).mean(), abs=1e-4)
    recalls = [r for r, _ in defect["curve"]]
    assert recalls == sorted(recalls, reverse=True) and recalls[0] == 1.0  # a higher threshold finds fewer
    assert all(0 <= p <= 1 for _, p in defect["curve"])


def test_the_report_draws_each_weak_class_precision_recall_curve_with_the_chosen_point():
    from report.model_sections import _precision_recall

    html = _precision_recall(
        {
            "defect": {"curve": [[1.0, 0.1], [0.5, 0.6], [0.25, 0.9]], "chosen": [0.5, 0.6]},
            "ok": {"curve": [[1.0, 0.98]], "chosen": [0.98, 0.99]},
        }
    )
    assert html.count("<svg") == 2 and "defect: precision against recall" in html
    assert html.count("<circle") == 4  # the chosen point and its legend, in each chart


def test_several_rare_classes_each_reach_the_floor():
    rng = np.random.default_rng(1)
    labels = np.array([0] * 300 + [1] * 8 + [2] * 6 + [3] * 7)
    probabilities = _scores(rng, labels, 3.5, [4.0, 0.0, 0.0, 0.0], 4)  # the common class swallows the rare ones
    argmax = operating_point.figures(labels, probabilities.argmax(1), 4)
    assert min(argmax["recall"][1:]) < 0.5

    decision = operating_point.choose(probabilities, labels, ["ok", "a", "b", "c"], "auto", 0.9, 0.5)

    chosen = decision["held_out"]["chosen"]
    assert decision["meets"], decision["reason"]
    assert min(chosen["recall"]) >= 0.5 and chosen["accuracy"] >= 0.9


def test_when_nothing_meets_the_gate_the_closest_point_names_the_class_that_falls_short():
    rng = np.random.default_rng(2)
    labels = np.array([0] * 200 + [1] * 10)
    probabilities = _scores(rng, labels, 0.0, [0.0, 0.0], 2)  # no signal at all

    decision = operating_point.choose(probabilities, labels, ["ok", "defect"], "auto", 0.95, 0.9)

    assert not decision["meets"]
    assert decision["reason"].startswith("nothing meets what is asked on held-out train data; closest: ")
    assert "recall" in decision["reason"] or "accuracy" in decision["reason"]


def test_a_users_recall_floor_is_met_and_argmax_keeps_the_heads_decision():
    rng = np.random.default_rng(3)
    labels = np.array([0] * 300 + [1] * 30)
    probabilities = _scores(rng, labels, 3.0, [0.0, 1.5], 2)

    floor = operating_point.choose(probabilities, labels, ["ok", "defect"], "ok>=0.98", 0.0, 0.0)
    assert floor["held_out"]["chosen"]["recall"][0] >= 0.98
    assert floor["asked"]["recall"] == {"ok": 0.98}

    plain = operating_point.choose(probabilities, labels, ["ok", "defect"], "argmax", 0.9, 0.5)
    assert plain["offsets"] == [0.0, 0.0]
    assert plain["held_out"]["chosen"] == plain["held_out"]["argmax"]


def test_temperature_scaling_calibrates_an_overconfident_model():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, 3000)
    logits = rng.normal(0.0, 1.0, (3000, 3))
    logits[np.arange(3000), labels] += 1.0
    overconfident = operating_point.softmax(4.0 * logits)  # right probabilities, sharpened four times

    decision = operating_point.choose(overconfident, labels, ["a", "b", "c"], "argmax", 0.0, 0.0)

    assert decision["temperature"] == pytest.approx(4.0, rel=0.15)
    held = decision["held_out"]
    assert held["ece_before"] > 0.15 and held["ece_after"] < 0.05
    assert sum(b["count"] for b in held["reliability_after"]) == 3000


@pytest.mark.parametrize("rule", ["", "ok", "ok>=", "ok>=1.5", ">=0.5", "ok>=x", "auto,ok>=0.5"])
def test_a_malformed_rule_is_one_line_naming_the_option(rule):
    with pytest.raises(ValueError, match=r"^--operating-point .*: use auto, argmax, or class recall floors") as e:
        operating_point.parse(rule)
    assert "\n" not in str(e.value)


def test_a_rule_naming_no_class_of_the_run_is_refused():
    with pytest.raises(ValueError, match=r"--operating-point names 'dog': not one of the classes \(ok, defect\)"):
        operating_point.choose(np.full((2, 2), 0.5), np.array([0, 1]), ["ok", "defect"], "dog>=0.5", 0.9, 0.5)


def test_each_label_gets_the_threshold_of_its_best_held_out_f1_on_the_evaluators_grid():
    rng = np.random.default_rng(5)
    hot = (rng.random((400, 2)) < [0.3, 0.05]).astype(np.float32)
    probabilities = np.clip(
        0.25 * hot + rng.random((400, 2)) * 0.5, 0, 1
    )  # a rare label scored low: its best F1 is too

    chosen = operating_point.label_thresholds(probabilities, hot, ["common", "rare"])

    assert chosen["rule"] == "best F1 on held-out train images" and chosen["held_out"]["images"] == 400
    for j, name in enumerate(["common", "rare"]):
        t = chosen["thresholds"][name]
        assert t in operating_point.THRESHOLD_GRID and t > 0

        def f1(u, j=j):
            given, actual = probabilities[:, j] >= u, hot[:, j] > 0
            return 2 * (given & actual).sum() / (given.sum() + actual.sum())

        assert chosen["held_out"]["per_label"][name]["f1"] == pytest.approx(f1(t))
        assert all(
            f1(u) <= f1(t) + 1e-12 for u in operating_point.THRESHOLD_GRID[1:] if (probabilities[:, j] >= u).any()
        )
    none = operating_point.label_thresholds(probabilities, np.zeros_like(hot), ["common", "rare"])
    assert none["thresholds"] == {"common": 0.5, "rare": 0.5}  # no held-out image has them
