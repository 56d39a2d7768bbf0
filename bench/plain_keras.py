"""What a user would write instead of imagepipe: the Keras tutorial recipe, as a script.

    python -m bench.plain_keras --train DIR --eval DIR [--size 64 --epochs 12 --seed 1]

`keras.utils.image_dataset_from_directory` over class folders (it shuffles the whole file list),
the same three-block CNN as imagepipe's `cnn` (written out here, not imported), batches of 64,
Adam at 1e-3, a fixed number of epochs, then the accuracy on the eval folders. Prints one JSON
line: {"accuracy", "seconds", "epochs"}.
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
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(train, validation_data=evaluation, epochs=args.epochs, verbose=0)
    _, accuracy = model.evaluate(evaluation, verbose=0)
    print(json.dumps({"accuracy": accuracy, "seconds": time.monotonic() - started, "epochs": args.epochs}))


if __name__ == "__main__":
    main()
