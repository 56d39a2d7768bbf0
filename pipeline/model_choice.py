"""--model auto (the default): which model a run trains, chosen from its images before the DAG is made.

Photo-sized images (the median shorter side of a sample at least PHOTO_SIDE pixels) get EfficientNet-Lite0
pretrained on ImageNet (its features cached, a head trained on them); small images get the small cnn.
Measured (docs/benchmarks.md, Transfer learning): on photo-like sets of 96-240 px the pretrained backbone's
head beat the cnn by far (2% defects: balanced accuracy 0.84-0.91 against 0.65; ten shapes on photos with a
long tail: 0.72 against 0.37); on 64 px crops told apart by one 12 px mark and on the 32 px digits, the cnn
wins or ties, and a backbone would upscale each image to its 224 px input.

The choice is made once, before the DAG (Transform's image size follows it): by the local runner after listing
the input (the Trainer then compares the backbone's head with the cnn and the backbone fine-tuned on the same
pixels, and keeps the best: trainer/model_trials.py); a compiled job (Vertex AI, Kubeflow) takes the backbone without reading its images
(for_compiled_job). It is said in the run's first line and the Trainer's summary (HParams.model_choice, kept in
training.json) and the model card.
"""

import dataclasses
import io
import statistics
from typing import List, NamedTuple, Optional, Sequence

from PIL import Image

from storage import files as fs
from storage.errors import ConfigError
from trainer.hparams import AUTO

PHOTO_SIDE = 96  # px: the median shorter side at or above which images are photos, for the backbone
SAMPLE = 64  # files whose sizes are read (headers only), spread over the listing
PHOTOS_MODEL, SMALL_MODEL = "efficientnet_lite0", "cnn"


class Choice(NamedTuple):
    model: str
    reason: str  # why, in a phrase: describe() says it in the run's first line, its summary and the model card


def sample(uris: Sequence[str], most: int = SAMPLE) -> List[str]:
    """Up to `most` of `uris`, evenly spread (every class of a sorted listing is reached), in a fixed order."""
    if len(uris) <= most:
        return list(uris)
    step = len(uris) / most
    return [uris[int(i * step)] for i in range(most)]


def shorter_sides(uris: Sequence[str]) -> List[int]:
    """The shorter side of each image that opens (headers only: nothing is decoded); others are skipped (the
    ingestion check quarantines them, with their reason)."""
    sides = []
    for uri in uris:
        try:
            if fs.is_remote(uri):
                with Image.open(io.BytesIO(fs.read_bytes(uri))) as image:
                    sides.append(min(image.size))
            else:
                with Image.open(uri) as image:
                    sides.append(min(image.size))
        except Exception:  # noqa: BLE001 - not an image, unreadable, a bomb's header: not counted
            continue
    return sides


def choose(uris: Sequence[str]) -> Choice:
    """The model for images like these (a sample of their files)."""
    sides = shorter_sides(sample(uris))
    if not sides:
        return Choice(PHOTOS_MODEL, "no sampled file opened as an image to measure")
    side = int(statistics.median(sides))
    measured = f"median shorter side {side} px over {len(sides)} sampled images"
    if side >= PHOTO_SIDE:
        return Choice(PHOTOS_MODEL, f"photo-sized images, {measured}")
    return Choice(SMALL_MODEL, f"small images, {measured}; a pretrained backbone from {PHOTO_SIDE} px")


def for_compiled_job() -> Choice:
    """A compiled job's choice, made without reading its data: its images are on Cloud Storage, read only by the
    job (by the hundred thousand, where a sample at compile time would need credentials and a listing); the
    pretrained backbone is the choice for photos, what such jobs train on."""
    return Choice(
        PHOTOS_MODEL, "a compiled job, chosen without reading its images; compile with --model cnn for small images"
    )


def resolved(config, choice: Optional[Choice]):
    """`config` (validated) with --model auto replaced by the choice (and the reason kept), its model-dependent
    settings checked again (the image size is the chosen model's); a given model is kept as it is."""
    if config.model != AUTO or choice is None:
        return config
    chosen = dataclasses.replace(config, model=choice.model, model_choice=choice.reason)
    try:
        return chosen.validate_model()
    except ConfigError as e:
        raise ConfigError(f"{e} ({choice.reason}; give --model to choose another)") from None
