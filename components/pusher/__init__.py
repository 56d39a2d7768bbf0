"""The Pusher: component.py (ImagePusher: TFX's Pusher, the model card's files pushed beside the model, each version
appearing whole or not at all).

A pushed version is serving/<name>/<version>/: the SavedModel, the card's files (threshold.json among them) and,
written last, PUSH_COMPLETE. `imagepipe predict` serves the newest version that is complete (complete_version).
"""

from components.model_card import FILES

PUSH_COMPLETE = "push_complete.json"  # written last into a pushed version: it is whole
STAGING_PREFIX = ".staging-"  # versions are made under <serving>/.staging-<id>/ and moved into place


def complete_version(folder: str, exists) -> bool:
    """Whether a pushed version is whole: PUSH_COMPLETE is there, or (a version pushed before it was written) the
    SavedModel and every card file, threshold.json last among them. `exists`: os.path.exists or its gs:// twin."""
    join = lambda name: f"{folder.rstrip('/')}/{name}"  # noqa: E731 - local or gs://
    if exists(join(PUSH_COMPLETE)):
        return True
    return exists(join("saved_model.pb")) and all(exists(join(name)) for name in FILES)
