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

from typing import List, NamedTuple, Optional, Tuple

import numpy as np

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
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(vectors, labels))
    # PCA is fitted on each fold's training rows: at most as many components as the smallest of them has rows
    # (a small transfer run: 40 images, 5 folds, 32 rows a fit).
    dims = min(PCA_DIMS, vectors.shape[1], min(len(train) for train, _ in splits) - 1)
    model = make_pipeline(StandardScaler(), PCA(max(1, dims), random_state=seed), StandardScaler(),
                          LogisticRegression(C=0.5, max_iter=500))
    return cross_val_predict(model, vectors, labels, method="predict_proba", cv=splits)


def probabilities_from_pixels(pixels: np.ndarray, labels: np.ndarray, folds: int, hp) -> np.ndarray:
    """The `cnn` of trainer/models.py trained a few epochs per fold ([n, size, size, channels] uint8 pixels)."""
    import dataclasses

    import keras
    from sklearn.model_selection import StratifiedKFold

    from trainer import models

    classes = int(labels.max()) + 1
    hp = dataclasses.replace(hp, model="cnn", image_size=pixels.shape[1])
    out = np.zeros((len(labels), classes), np.float32)
    steps = -(-len(labels) * (folds - 1) // folds // hp.batch_size)  # a fold's steps per epoch
    epochs = int(np.clip(-(-CNN_MIN_STEPS // steps), CNN_EPOCHS, CNN_MAX_EPOCHS))
    for fold, (train, held_out) in enumerate(StratifiedKFold(folds, shuffle=True, random_state=hp.seed)
                                             .split(pixels, labels)):
        keras.utils.set_random_seed(hp.seed + fold)
        model = models.build(hp, classes)
        models.compile_model(model, hp.learning_rate)
        model.fit(pixels[train].astype(np.float32), labels[train], batch_size=hp.batch_size, epochs=epochs,
                  verbose=0, shuffle=True)
        out[held_out] = model.predict(pixels[held_out].astype(np.float32), batch_size=256, verbose=0)
    return out


def rank(labels: np.ndarray, probabilities: np.ndarray) -> List[Suspect]:
    """The examples cleanlab finds mislabelled, most likely first."""
    from cleanlab.filter import find_label_issues

    # n_jobs=1: by default cleanlab forks a process pool of the executor's process (TensorFlow's threads
    # running, gigabytes mapped: a fork risks a deadlock, and each child's RSS counts again) for per-class
    # work that takes milliseconds.
    order = find_label_issues(labels, probabilities, return_indices_ranked_by="self_confidence", n_jobs=1)
    return [Suspect(int(i), int(labels[i]), int(probabilities[i].argmax()), float(probabilities[i, labels[i]]))
            for i in order]


def out_of_sample(labels: np.ndarray, vectors: Optional[np.ndarray], pixels: Optional[np.ndarray], hp,
                  folds: int) -> np.ndarray:
    if vectors is not None:
        return probabilities_from_features(vectors, labels, folds, hp.seed)
    return probabilities_from_pixels(pixels, labels, folds, hp)
