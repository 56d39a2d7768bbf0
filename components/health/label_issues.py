"""Likely label errors: out-of-sample class probabilities for every example, ranked by confident learning.

Each example's probabilities come from a model that never saw it (k-fold: trained on the other folds):

- on the backbone features of the transfer models (the features step's output): a logistic
  regression on PCA-reduced, standardised features, a few seconds for thousands of images;
- for the `cnn`, which has no features, on pixels: the same small CNN trained a few epochs per
  fold at 32 px (opt-in, --label-check on: about a fifth of a run on the digits).

cleanlab (confident learning: per-class thresholds on the out-of-sample probabilities, the
confident joint of given and likely labels) then picks the examples whose given label is
probably wrong, ranked most likely first by self-confidence (the probability of the given label).
Nothing is relabelled or dropped: the suspects go into the report and label_issues.csv.
"""

import dataclasses
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from trainer import class_balance

# Folds on features; the cnn on pixels trains CNN_FOLDS models (measured on the digits with 5% of the
# labels flipped: 3 folds found 80 of 89 flips among the first 178 suspects in 15 s, 5 folds 81 in 25 s).
FOLDS, CNN_FOLDS = 5, 3
PCA_DIMS = 128
CNN_EPOCHS = 4  # a fold's epochs at least; small sets get more, up to CNN_MAX_EPOCHS, for CNN_MIN_STEPS steps
CNN_MIN_STEPS, CNN_MAX_EPOCHS = 120, 12
# The pixel check works on images of at most this side (3 kB an image at 32 px: 20,000 images in
# ~60 MB, whatever --image-size is). Measured on the digits with 5% of the labels flipped: 64 px and 6
# epochs a fold found 76 of 89 flips among the first 178 suspects in 81 s; 32 px and 4 epochs, 79 in 23 s.
CNN_MAX_SIZE = 32
# A multi-label fold learns several outputs at once: more steps, and its rare labels weighted (measured on
# bench/multilabel.py's coloured squares, 540 images with 20 label sets missing a label: 12 epochs unweighted found 4
# of them among the first 40 suspects in 8 s; 40 epochs weighted 15 and 16 on two sets, in 17 s).
MULTI_LABEL_MIN_STEPS, MULTI_LABEL_MAX_EPOCHS = 240, 40


class Suspect(NamedTuple):
    index: int  # into the examples checked
    given: int  # class id
    suggested: int  # the most likely class
    given_probability: float  # out-of-sample probability of the given label (self-confidence)


def folds_for(labels: np.ndarray, folds: int = FOLDS) -> Tuple[int, str]:
    """(folds to use, "") or (0, why none): every class needs an example in each fold."""
    counts = np.bincount(labels)
    smallest = int(counts[counts > 0].min()) if counts.any() else 0
    if len(counts[counts > 0]) < 2:
        return 0, "fewer than two classes"
    if smallest < 2:
        return 0, "a class has a single example"
    return min(folds, smallest), ""


def probabilities_from_features(vectors: np.ndarray, labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    # scikit-learn's models (~0.2 s): only the label check fits them, and it can be off
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(vectors, labels))
    # PCA is fitted on each fold's training rows: at most as many components as the smallest of them has rows
    # (a small transfer run: 40 images, 5 folds, 32 rows a fit).
    dims = min(PCA_DIMS, vectors.shape[1], min(len(train) for train, _ in splits) - 1)
    model = make_pipeline(
        StandardScaler(),
        PCA(max(1, dims), random_state=seed),
        StandardScaler(),
        LogisticRegression(C=0.5, max_iter=500),
    )
    return cross_val_predict(model, vectors, labels, method="predict_proba", cv=splits)


def probabilities_from_pixels(pixels: np.ndarray, labels: np.ndarray, folds: int, hp) -> np.ndarray:
    """The `cnn` of trainer/models.py trained a few epochs per fold ([n, size, size, channels] uint8 pixels)."""

    # Keras and scikit-learn: only the opt-in label check on pixels (the cnn) trains models
    import keras
    from sklearn.model_selection import StratifiedKFold

    # imports Keras: the same reason
    from trainer import models

    classes = int(labels.max()) + 1
    hp = dataclasses.replace(hp, model="cnn", image_size=pixels.shape[1])
    out = np.zeros((len(labels), classes), np.float32)
    steps = -(-len(labels) * (folds - 1) // folds // hp.batch_size)  # a fold's steps per epoch
    epochs = int(np.clip(-(-CNN_MIN_STEPS // steps), CNN_EPOCHS, CNN_MAX_EPOCHS))
    for fold, (train, held_out) in enumerate(
        StratifiedKFold(folds, shuffle=True, random_state=hp.seed).split(pixels, labels)
    ):
        keras.utils.set_random_seed(hp.seed + fold)
        model = models.build(hp, classes)
        models.compile_model(model, hp)
        model.fit(
            pixels[train].astype(np.float32),
            labels[train],
            batch_size=hp.batch_size,
            epochs=epochs,
            verbose=0,
            shuffle=True,
        )
        out[held_out] = model.predict(pixels[held_out].astype(np.float32), batch_size=256, verbose=0)
    return out


def rank(labels: np.ndarray, probabilities: np.ndarray) -> List[Suspect]:
    """The examples cleanlab finds mislabelled, most likely first."""
    # cleanlab: only the label check uses it, and it can be off
    from cleanlab.filter import find_label_issues

    # n_jobs=1: by default cleanlab forks a process pool of the executor's process (TensorFlow's threads
    # running, gigabytes mapped: a fork risks a deadlock, and each child's RSS counts again) for per-class
    # work that takes milliseconds.
    order = find_label_issues(labels, probabilities, return_indices_ranked_by="self_confidence", n_jobs=1)
    return [
        Suspect(int(i), int(labels[i]), int(probabilities[i].argmax()), float(probabilities[i, labels[i]]))
        for i in order
    ]


def out_of_sample(
    labels: np.ndarray, vectors: Optional[np.ndarray], pixels: Optional[np.ndarray], hp, folds: int
) -> np.ndarray:
    if vectors is not None:
        return probabilities_from_features(vectors, labels, folds, hp.seed)
    return probabilities_from_pixels(pixels, labels, folds, hp)


# --- multi-label: several labels an image, none included ----------------------------------------------------


class MultiLabelSuspect(NamedTuple):
    index: int  # into the examples checked
    given: List[int]  # the image's label ids
    suggested: List[int]  # the labels whose out-of-sample probability is above one half
    quality: float  # cleanlab's label quality score of the given set (low: likely wrong)


def multi_hot(label_sets: List[List[int]], classes: int) -> np.ndarray:
    hot = np.zeros((len(label_sets), classes), np.float32)
    for i, ids in enumerate(label_sets):
        hot[i, [c for c in ids if 0 <= c < classes]] = 1.0
    return hot


def multi_label_folds(hot: np.ndarray, folds: int = FOLDS) -> Tuple[int, str]:
    """(folds to use, "") or (0, why none): the labels that at least two images have and two lack (the others are
    predicted at their share, multi_label_probabilities_from_features) set the folds: up to `folds`, as many as the
    rarer side of the rarest such label allows."""
    present = hot.sum(axis=0)
    sides = np.minimum(present, len(hot) - present)
    usable = sides[sides >= 2]
    if len(usable) < 1:
        return 0, "no label that at least two images have and two lack"
    return int(min(folds, usable.min())), ""


def multi_label_probabilities_from_features(vectors: np.ndarray, hot: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Out-of-sample probability of each label, k-fold: a logistic regression per label on PCA-reduced,
    standardised features (a label a fold's training rows all have, or all lack, gets its share there)."""
    # scikit-learn's models (~0.2 s): only the label check fits them, and it can be off
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out = np.zeros_like(hot)
    for train, held_out in KFold(folds, shuffle=True, random_state=seed).split(vectors):
        # The reduction of probabilities_from_features, fitted on the fold's training rows, once for every label.
        reduce = make_pipeline(
            StandardScaler(),
            PCA(max(1, min(PCA_DIMS, vectors.shape[1], len(train) - 1)), random_state=seed),
            StandardScaler(),
        )
        x_train, x_held = reduce.fit_transform(vectors[train]), reduce.transform(vectors[held_out])
        for label in range(hot.shape[1]):
            y = hot[train, label]
            if y.min() == y.max():
                out[held_out, label] = y.mean()
                continue
            model = LogisticRegression(C=0.5, max_iter=500).fit(x_train, y)
            out[held_out, label] = model.predict_proba(x_held)[:, 1]
    return out


def multi_label_probabilities_from_pixels(pixels: np.ndarray, hot: np.ndarray, folds: int, hp) -> np.ndarray:
    """The `cnn` of trainer/models.py, multi-label, trained a few epochs per fold (as probabilities_from_pixels)."""

    # Keras and scikit-learn: only the opt-in label check on pixels (the cnn) trains models
    import keras
    from sklearn.model_selection import KFold

    # imports Keras: the same reason
    from trainer import models

    hp = dataclasses.replace(hp, model="cnn", image_size=pixels.shape[1])
    out = np.zeros_like(hot)
    steps = -(-len(hot) * (folds - 1) // folds // hp.batch_size)
    epochs = int(np.clip(-(-MULTI_LABEL_MIN_STEPS // steps), CNN_EPOCHS, MULTI_LABEL_MAX_EPOCHS))
    for fold, (train, held_out) in enumerate(KFold(folds, shuffle=True, random_state=hp.seed).split(pixels)):
        keras.utils.set_random_seed(hp.seed + fold)
        model = models.build(hp, hot.shape[1], multi_label=True)
        # Rare labels weighed as the Trainer weighs them: unweighted, a fold's model hardly ever gives them.
        models.compile_model(
            model, hp, class_balance.positive_weights([int(n) for n in hot[train].sum(axis=0)], len(train))
        )
        model.fit(
            pixels[train].astype(np.float32),
            hot[train],
            batch_size=hp.batch_size,
            epochs=epochs,
            verbose=0,
            shuffle=True,
        )
        out[held_out] = model.predict(pixels[held_out].astype(np.float32), batch_size=256, verbose=0)
    return out


def rank_multi_label(label_sets: List[List[int]], probabilities: np.ndarray) -> List[MultiLabelSuspect]:
    """The images whose label set cleanlab's multi-label confident learning finds wrong (a label missing or one
    too many), most likely first."""
    # cleanlab: only the label check uses it, and it can be off
    from cleanlab.multilabel_classification.filter import find_label_issues
    from cleanlab.multilabel_classification.rank import get_label_quality_scores

    labels = [sorted(set(ids)) for ids in label_sets]
    order = find_label_issues(labels, probabilities, return_indices_ranked_by="self_confidence", n_jobs=1)
    quality = get_label_quality_scores(labels, probabilities)
    return [
        MultiLabelSuspect(
            int(i), labels[i], [int(c) for c in np.flatnonzero(probabilities[i] > 0.5)], float(quality[i])
        )
        for i in order
    ]
