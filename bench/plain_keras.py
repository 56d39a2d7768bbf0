"""What a user would write instead of imagepipe: the Keras tutorial recipe, as a script.

    python -m bench.plain_keras --train DIR --eval DIR [--size 64 --epochs 12 --seed 1] [--class-weight]

`keras.utils.image_dataset_from_directory` over class folders (it shuffles the whole file list),
the same three-block CNN as imagepipe's `cnn` (written out here, not imported), batches of 64,
Adam at 1e-3, a fixed number of epochs, then the accuracy on the eval folders. With --class-weight, the
Keras imbalanced-classification recipe: fit(class_weight={class: n / (k * count)}). Prints one JSON
line: {"accuracy", "balanced_accuracy", "recall" {class: recall}, "seconds", "epochs"}.
"""

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--eval", required=True)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--class-weight", action="store_true", help="weight the loss by n / (k * class count)")
    args = parser.parse_args()

    import keras

    started = time.monotonic()
    keras.utils.set_random_seed(args.seed)
    shape = (args.size, args.size)
    train = keras.utils.image_dataset_from_directory(args.train, image_size=shape, batch_size=64, seed=args.seed)
    evaluation = keras.utils.image_dataset_from_directory(args.eval, image_size=shape, batch_size=64, shuffle=False)
    classes = len(train.class_names)
    model = keras.Sequential([keras.Input(shape + (3,)), keras.layers.Rescaling(1 / 255.0)])
    for filters in (16, 32, 64):
        model.add(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"))
        model.add(keras.layers.MaxPooling2D())
    model.add(keras.layers.Flatten())
    model.add(keras.layers.Dropout(0.3))
    model.add(keras.layers.Dense(classes, activation="softmax"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    weights = None
    if args.class_weight:
        import numpy as np

        counts = np.bincount(np.concatenate([y.numpy() for _, y in train]), minlength=classes)
        weights = {c: counts.sum() / (classes * n) for c, n in enumerate(counts) if n}
    model.fit(train, validation_data=evaluation, epochs=args.epochs, verbose=0, class_weight=weights)
    _, accuracy = model.evaluate(evaluation, verbose=0)
    import numpy as np

    labels = np.concatenate([y.numpy() for _, y in evaluation])
    predicted = model.predict(evaluation, verbose=0).argmax(axis=1)
    recall = {
        name: float((predicted[labels == c] == c).mean())
        for c, name in enumerate(train.class_names)
        if (labels == c).any()
    }
    print(
        json.dumps(
            {
                "accuracy": accuracy,
                "balanced_accuracy": float(np.mean(list(recall.values()))),
                "recall": recall,
                "seconds": time.monotonic() - started,
                "epochs": args.epochs,
            }
        )
    )


if __name__ == "__main__":
    main()
