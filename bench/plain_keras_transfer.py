"""What a user would write for transfer learning: the Keras transfer-learning guide's recipe, as a script.

    python -m bench.plain_keras_transfer --train DIR --eval DIR [--size 224 --epochs 10 --seed 1]

keras.io's "Transfer learning & fine-tuning" guide, its first phase: `image_dataset_from_directory`, random
flips and rotations, the pretrained base frozen and called with training=False, global average pooling,
dropout 0.2, a softmax classifier, Adam at 1e-3, a fixed number of epochs; the base runs on every image of
every epoch. The base is the same EfficientNet-Lite0 imagepipe uses, with the same ImageNet weights (the
project's builder: keras.applications has no Lite models, and downloads its weights). Prints one JSON line:
{"accuracy", "balanced_accuracy", "recall" {class: recall}, "seconds", "epochs"}.
"""

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--eval", required=True)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import keras
    import numpy as np

    from trainer import efficientnet_lite

    started = time.monotonic()
    keras.utils.set_random_seed(args.seed)
    shape = (args.size, args.size)
    train = keras.utils.image_dataset_from_directory(args.train, image_size=shape, batch_size=32, seed=args.seed)
    evaluation = keras.utils.image_dataset_from_directory(args.eval, image_size=shape, batch_size=32, shuffle=False)
    base = efficientnet_lite.build(shape + (3,))
    efficientnet_lite.load_pth(base, efficientnet_lite.packaged_weights())
    base.trainable = False
    augmentation = keras.Sequential([keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.1)])
    inputs = keras.Input(shape + (3,))
    x = augmentation(inputs)
    x = keras.layers.Rescaling(1 / 128.0, offset=-127 / 128.0)(x)  # the Lite models' (x - 127) / 128
    x = base(x, training=False)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    outputs = keras.layers.Dense(len(train.class_names), activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(train, validation_data=evaluation, epochs=args.epochs, verbose=0)
    _, accuracy = model.evaluate(evaluation, verbose=0)
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
