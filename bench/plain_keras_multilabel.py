"""What a user would write instead of imagepipe for a multi-label set: the Keras recipe, as a script.

    python -m bench.plain_keras_multilabel --data DIR [--size 96 --epochs 30 --seed 1]

Reads a set bench/multilabel.py wrote (labels.csv: path, labels, split), decodes every image with
`keras.utils.load_img` at --size, the same three-block CNN as imagepipe's `cnn` with a sigmoid output
(written out here, not imported), binary cross-entropy, batches of 64, Adam at 1e-3, a fixed number of
epochs, then each label's threshold at 0.5 (what a hand-written script does). Prints one JSON line:
{"macro_auc_pr", "f1" {label: F1 at 0.5}, "macro_f1", "seconds", "epochs"} on the eval rows.
"""

import argparse
import json
import time

import numpy as np


def f1_at(probabilities: np.ndarray, hot: np.ndarray, thresholds) -> list:
    """Each label's F1 with the label given above its threshold."""
    scores = []
    for label, threshold in enumerate(thresholds):
        given, actual = probabilities[:, label] > threshold, hot[:, label] > 0.5
        tp, fp, fn = float((given & actual).sum()), float((given & ~actual).sum()), float((~given & actual).sum())
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return scores


def auc_pr(probabilities: np.ndarray, hot: np.ndarray) -> list:
    """Each label's area under the precision-recall curve (average precision, scikit-learn's)."""
    from sklearn.metrics import average_precision_score

    return [
        float(average_precision_score(hot[:, c], probabilities[:, c])) if hot[:, c].any() else float("nan")
        for c in range(hot.shape[1])
    ]


def load(rows, size: int, labels):
    import keras

    images = np.stack(
        [np.asarray(keras.utils.load_img(path, target_size=(size, size)), np.float32) for path, _, _ in rows]
    )
    hot = np.zeros((len(rows), len(labels)), np.float32)
    for i, (_, names, _) in enumerate(rows):
        hot[i, [labels.index(n) for n in names]] = 1.0
    return images, hot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import keras

    from bench.multilabel import read_rows

    started = time.monotonic()
    keras.utils.set_random_seed(args.seed)
    rows = read_rows(args.data)
    labels = sorted({n for _, names, _ in rows for n in names})
    x_train, y_train = load([r for r in rows if r[2] == "train"], args.size, labels)
    x_eval, y_eval = load([r for r in rows if r[2] == "eval"], args.size, labels)
    model = keras.Sequential([keras.Input((args.size, args.size, 3)), keras.layers.Rescaling(1 / 255.0)])
    for filters in (16, 32, 64):
        model.add(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"))
        model.add(keras.layers.MaxPooling2D())
    model.add(keras.layers.Flatten())
    model.add(keras.layers.Dropout(0.3))
    model.add(keras.layers.Dense(len(labels), activation="sigmoid"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    model.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0, shuffle=True)
    probabilities = model.predict(x_eval, batch_size=256, verbose=0)
    areas = auc_pr(probabilities, y_eval)
    f1 = f1_at(probabilities, y_eval, [0.5] * len(labels))
    print(
        json.dumps(
            {
                "macro_auc_pr": float(np.nanmean(areas)),
                "auc_pr": dict(zip(labels, areas)),
                "f1": dict(zip(labels, f1)),
                "macro_f1": float(np.mean(f1)),
                "seconds": time.monotonic() - started,
                "epochs": args.epochs,
            }
        )
    )


if __name__ == "__main__":
    main()
