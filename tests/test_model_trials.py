"""--model auto by measurement (trainer/model_trials.py): which candidate the Trainer keeps, what it says, what a
candidate may cost, and the cnn candidate on the backbone's input. The whole DAG with the comparison runs in
tests/test_held_out.py (photo-sized digits: the same candidates and figures whatever the eval split holds)."""

import numpy as np
import pytest

from trainer import model_trials
from trainer.hparams import HParams
from trainer.model_trials import Trial


def _trials(*figures):
    names = [("head", "efficientnet_lite0's head"), ("cnn", "the cnn (56 px)"), ("fine-tuned", "fine-tuned")]
    return [Trial(name, label, figure) for (name, label), figure in zip(names, figures)]


@pytest.mark.parametrize(
    "figures, kept",
    [
        ((0.80, 0.805, None), 0),  # within MIN_GAIN of the head: the head, the cheaper, stays
        ((0.80, 0.85, None), 1),
        ((0.80, 0.85, 0.855), 1),  # the fine-tuned one does not beat the best so far by more than MIN_GAIN
        ((0.80, 0.50, 0.90), 2),
        ((0.80, None, None), 0),  # nothing else tried
    ],
)
def test_a_costlier_candidate_is_kept_only_when_it_beats_the_best_so_far_by_more_than_the_margin(figures, kept):
    assert model_trials.winner(_trials(*figures)) == kept


def test_the_summary_says_what_was_tried_each_figure_and_why_the_winner_won():
    trials = _trials(0.889, 1.0, None)
    trials[2].note = model_trials.not_tried(5, 25 * 60, 12 * 60)
    said = model_trials.describe(trials, model_trials.winner(trials), "accuracy", 90)
    assert said == (
        "compared on 90 held-out train images by accuracy: efficientnet_lite0's head 0.889; the cnn (56 px) 1.000; "
        "fine-tuned not tried: 5 epochs would take ~25.0 min at its measured pace, 12.0 min of --auto-trial-minutes "
        "left; kept the cnn (56 px): better than efficientnet_lite0's head by 0.111"
    )
    head_kept = model_trials.describe(_trials(0.9, 0.5, 0.905), 0, "balanced accuracy", 412)
    assert head_kept.endswith("kept efficientnet_lite0's head: no other candidate beat it by more than 0.01")


def test_a_candidate_costs_its_measured_pace_over_its_first_epochs():
    # 0.5 s a step of 64 images; 6,400 training images and 1,600 held out (a held-out image: a third of a step's)
    # and one reading of both parts at 0.2 s a batch read from the files (the first epoch's, which fills the cache)
    said = model_trials.estimate(0.5, 0.2, 64, 6400, 1600, 5)
    assert said == pytest.approx(5 * 0.5 / 64 * (6400 + 1600 / 3) + 0.2 / 64 * (6400 + 1600))
    now = [1000.0]
    budget = model_trials.Budget(20, clock=lambda: now[0])
    assert budget.left() == 1200.0
    now[0] += 1500
    assert budget.left() == 0.0


@pytest.mark.parametrize(
    "changes, tuned, warm, workers, held, reason",
    [
        ({}, False, False, 1, 50, ""),
        ({"model_choice": ""}, False, False, 1, 50, "the model was given"),
        ({"model": "cnn"}, False, False, 1, 50, "the size rule chose the cnn"),
        ({"auto_trial_minutes": 0}, False, False, 1, 50, "--auto-trial-minutes 0"),
        ({}, True, False, 1, 50, "the Tuner"),
        ({}, False, True, 1, 50, "warm-started"),
        ({}, False, False, 2, 50, "a cluster"),
        ({}, False, False, 1, 0, "nothing held out"),
    ],
)
def test_candidates_are_compared_only_where_auto_chose_a_backbone_and_nothing_else_fixes_the_model(
    changes, tuned, warm, workers, held, reason
):
    hp = HParams(**{"model": "efficientnet_lite0", "model_choice": "photo-sized images", **changes})
    said = model_trials.applies(hp, tuned, warm, workers, held)
    assert (said == "") if not reason else (reason in said), said


def test_the_candidates_settings():
    hp = HParams(model="efficientnet_lite0", model_choice="photo-sized images")
    cnn = model_trials.cnn_hparams(hp)
    assert (cnn.model, cnn.image_size, cnn.cnn_downsample, cnn.head_dropout) == ("cnn", 224, 4, 0.3)
    assert model_trials.cnn_hparams(HParams(model="efficientnet_lite0", image_size=300)).cnn_downsample == 5
    assert model_trials.cnn_hparams(HParams(model="efficientnet_lite0", image_size=32)).cnn_downsample == 1
    tuned = model_trials.fine_tuned_hparams(hp)
    assert (tuned.fine_tune_epochs, tuned.fine_tune_learning_rate) == (10, pytest.approx(1e-4))
    assert (
        model_trials.fine_tuned_hparams(HParams(model="efficientnet_lite0", fine_tune_epochs=3)).fine_tune_epochs == 3
    )
    with pytest.raises(ValueError, match="cnn_downsample 9: use 1 to 16, leaving the cnn at least 8 px of its 64 px"):
        HParams(model="cnn", image_size=64, cnn_downsample=9).validate()


def test_the_cnn_candidate_averages_the_backbone_input_down_and_rebuilds_from_its_settings():
    """What the TFLite and ONNX child does: the model made again from training.json's settings takes the saved
    weights and gives the same probabilities."""
    import keras

    from trainer import models

    hp = model_trials.cnn_hparams(HParams(model="efficientnet_lite0", image_size=224))
    model = models.build(hp, 3)
    assert model.input_shape == (None, 224, 224, 3) and model.get_layer("downsampled").output.shape[1:3] == (56, 56)
    again = models.build(HParams.from_custom_config(hp.to_custom_config()), 3)
    again.set_weights(model.get_weights())
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 224, 224, 3)).astype("float32")
    np.testing.assert_allclose(again(pixels), model(pixels), rtol=1e-5, atol=1e-6)
    assert isinstance(model.get_layer("downsampled"), keras.layers.AveragePooling2D)  # every converter has it


def test_a_candidate_stops_at_the_deadline_and_its_pace_is_measured_by_training_steps():
    import time

    import keras
    import tensorflow as tf

    from trainer.training import TrialStop, seconds_per_step

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.normal(size=(64, 4)), rng.integers(0, 2, 64))).batch(8).repeat()
    before = [w.copy() for w in model.get_weights()]
    assert seconds_per_step(model, data, 3) > 0
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))  # it trained on those steps
    stop = TrialStop(time.monotonic())  # already past: the first epoch is the last
    history = model.fit(data, steps_per_epoch=2, epochs=10, callbacks=[stop], verbose=0)
    assert stop.why == "stopped at --auto-trial-minutes" and len(history.history["loss"]) == 1


# Held-out curves of real trials (training.json's model_trials): the cnn at 100,000 images (docs/benchmarks.md,
# "Scale": ~44 s an epoch, stopped by the 10-minute budget after 13 epochs; to be kept it had to pass the head's 0.9686
# by MIN_GAIN), and bench/model_choice_benchmark.py's marked-128 and marked-192 cnns, slow starters that reach 1.000
# (their heads 0.878 and 0.867).
CNN_100K = [0.614, 0.737, 0.791, 0.829, 0.843, 0.874, 0.869, 0.895, 0.906, 0.901, 0.919, 0.919, 0.922]
MARKED_128 = [0.3333, 0.3556, 0.3667, 0.3556, 0.4111, 0.3222, 0.3222, 0.4111, 0.4, 0.4444, 0.5444, 0.6556, 0.6778]
MARKED_128 += [0.7444, 0.8333, 0.8333, 0.9, 0.9111, 0.9667, 0.9556, 0.9444, 0.9667, 0.9556, 0.9667, 0.9667, 0.9778]
MARKED_192 = [0.4111, 0.3222, 0.3556, 0.3778, 0.3889, 0.3111, 0.3889, 0.4222, 0.4333, 0.4111, 0.4889, 0.5667, 0.6222]
MARKED_192 += [0.6778, 0.7111, 0.7667, 0.7778, 0.8778, 0.8889, 0.8333, 0.9667, 0.9778, 0.9333, 0.9778, 1.0]


def _first_stop(curve, target, epochs_in_budget, window=5):
    """The epoch after which cannot_catch_up stops a candidate whose budget holds `epochs_in_budget` epochs (0: never)."""
    for epoch in range(1, len(curve) + 1):
        if model_trials.cannot_catch_up(curve[:epoch], target, epochs_in_budget - epoch, window):
            return epoch
    return 0


def test_a_candidate_that_cannot_catch_up_at_its_recent_pace_stops_and_a_slow_starter_does_not():
    # The cnn at 100,000 images: 13.6 epochs fitted its budget; after epoch 9 (0.906, +0.0154 an epoch over the last
    # 5, a fifth of its steepest) the 4 epochs left could reach 0.968 at most: 4 of its 13 epochs saved.
    assert _first_stop(CNN_100K, 0.9686 + model_trials.MIN_GAIN, 13) == 9
    said = model_trials.cannot_catch_up(CNN_100K[:9], 0.9786, 4, 5)
    assert said == (
        "stopped after 9 epochs: at its pace of the last 5 (+0.0154 an epoch) it would reach 0.968 in the 4 epochs "
        "left, not the 0.979 it had to pass"
    )
    # With a budget of 28 epochs (this machine's fast hours) it is not stopped while it might still get there.
    assert _first_stop(CNN_100K, 0.9786, 28) == 0
    # The slow starters are never stopped, even with only the epochs they took left: flat near their start at first,
    # then rising as fast as ever.
    for curve, head in ((MARKED_128, 0.878), (MARKED_192, 0.867)):
        assert _first_stop(curve, head + model_trials.MIN_GAIN, len(curve)) == 0
    # A candidate that has passed the target goes on (training keeps its best epoch); so does one too short to judge.
    assert model_trials.cannot_catch_up(CNN_100K, 0.92, 0, 5) == ""
    assert model_trials.cannot_catch_up(CNN_100K[:5], 0.99, 0, 5) == ""


def test_a_trained_candidate_stops_once_its_held_out_figure_cannot_pass_the_target():
    """Keras, for real: a model that learns nothing (learning rate 0) keeps its held-out figure flat; against a target
    of that figure it is stopped after its window's epochs and one, with the reason, long before the budget."""
    import time

    import keras
    import tensorflow as tf

    from trainer.training import TrialStop

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 2, 64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    flat = model.evaluate(data, verbose=0, return_dict=True)["sparse_categorical_accuracy"]
    stop = TrialStop(time.monotonic() + 600, flat, "val_sparse_categorical_accuracy", window=3)
    history = model.fit(data, validation_data=data, epochs=50, callbacks=[stop], verbose=0)
    assert len(history.history["loss"]) == 4 and stop.curve == pytest.approx([flat] * 4)
    assert stop.why.startswith("stopped after 4 epochs: at its pace of the last 3 (+0.0000 an epoch)")


def test_the_report_shows_each_candidate_and_the_kept_one():
    from report.model_sections import _model_trials

    trials = _trials(0.889, 1.0, None)
    trials[2].note = model_trials.not_tried(5, 25 * 60, 12 * 60)
    html = _model_trials(
        {
            "size_rule": "photo-sized images, median shorter side 128 px over 64 sampled images",
            "budget_minutes": 20,
            "figure": "val_balanced_accuracy",
            "candidates": [t.record() for t in trials],
            "kept": "cnn",
        }
    )
    assert "<h3>Model choice</h3>" in html and "by balanced accuracy" in html
    assert '<td><b>the cnn (56 px)</b></td><td class="n">1.0000</td>' in html
    assert 'efficientnet_lite0&#x27;s head</td><td class="n">0.8890</td>' in html
    assert "not tried: 5 epochs would take ~25.0 min" in html
    assert _model_trials(None) == ""


def test_nothing_is_tried_against_a_best_that_cannot_be_beaten_by_the_margin():
    assert model_trials.unbeatable(_trials(0.95)) == ""
    said = model_trials.unbeatable(_trials(0.995))
    assert said == "not tried: efficientnet_lite0's head scores 0.995, which nothing can beat by more than 0.01"
    assert model_trials.unbeatable(_trials(0.80, 1.0)).startswith("not tried: the cnn (56 px) scores 1.000")


def test_the_cnn_candidate_trains_on_its_images_averaged_down_once_and_serves_full_size_images(tmp_path):
    """At 224 px the cnn candidate averages 4 x 4 squares first: it trains on those averages made once
    (input_pipeline.downsampled_images: exact sums, an eighth of the records' memory) through a view of its own
    layers (models.downsampled_view), and the cnn itself, what is exported, gives the same probabilities on the
    full-size images."""
    import dataclasses

    import tensorflow as tf

    from trainer import features, input_pipeline, models

    size, k, count = 32, 4, 40
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    labels = np.arange(count) % 3
    path = str(tmp_path / "part-0.gz")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for image, label in zip(pixels, labels):
            feature = {
                features.PIXELS_KEY: tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[tf.io.serialize_tensor(image).numpy()])
                ),
                features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    hp = HParams(model="cnn", image_size=size, cnn_downsample=k, batch_size=16, seed=1)
    assert models.trains_downsampled(hp)
    assert not models.trains_downsampled(dataclasses.replace(hp, augment="flip"))  # augmenting needs the full image
    assert not models.trains_downsampled(dataclasses.replace(hp, cnn_downsample=1))
    down = input_pipeline.Batching(downsampled=True)

    sums = np.concatenate([x.numpy() for x, _ in input_pipeline.make_dataset([path], hp, False, batching=down)])
    expected = pixels.astype(np.int64).reshape(count, size // k, k, size // k, k, 3).sum(axis=(2, 4))
    np.testing.assert_array_equal(sums, expected)  # exact, and in the records' order
    held, full = input_pipeline.read_records([path], hp, batching=down), input_pipeline.read_records([path], hp)
    assert held.count == count and held.megabytes == pytest.approx(count * (8 * 8 * 3 * 2 + 8) / 2**20)
    assert held.megabytes < full.megabytes / 7  # the records hold 3,072 pixel bytes an image, the sums 392 bytes

    cnn = models.build(hp, 3)
    view = models.downsampled_view(cnn, hp)
    assert view.input_shape == (None, 8, 8, 3) and cnn.input_shape == (None, size, size, 3)
    np.testing.assert_allclose(view(sums.astype(np.float32)), cnn(pixels.astype(np.float32)), rtol=1e-5, atol=1e-7)
    models.compile_model(view, hp)
    before = [w.copy() for w in cnn.get_weights()]
    view.fit(input_pipeline.make_dataset([], hp, True, batching=down, shared_records=held), epochs=1, verbose=0)
    assert all(not np.array_equal(a, b) for a, b in zip(before, cnn.get_weights()))  # training the view trained it
    np.testing.assert_allclose(view(sums.astype(np.float32)), cnn(pixels.astype(np.float32)), rtol=1e-5, atol=1e-7)

    # Several replicas' padded evaluation and class-balanced batches take the sums too.
    padded = list(input_pipeline.make_dataset([path], hp, False, batching=down._replace(size=16, drop_remainder=True)))
    assert [len(w) for _, _, w in padded] == [16, 16, 16] and sum(float(w.numpy().sum()) for _, _, w in padded) == 40
    balance = input_pipeline.Balance("sampling", shares=[1 / 3] * 3, counts=[14, 13, 13])
    drawn = list(input_pipeline.make_dataset([path], hp, True, batching=down, balance=balance))
    assert sum(len(y) for _, y in drawn) == count and drawn[0][0].shape[1:] == (8, 8, 3)
    assert set(np.concatenate([y.numpy() for _, y in drawn]).tolist()) == {0, 1, 2}
