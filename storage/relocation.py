"""The latest blessed model's artifacts, found where they are now, or a one-line error.

ML Metadata keeps each artifact's URI as it was written. Locally those are paths under
`<root>/pipelines/<name>/`: after the root is moved or copied (or, from versions that recorded a
relative --root, when a run starts in another folder) the recorded path names nothing. Reading
an artifact then follows the root: the part of the recorded path below `pipelines/<name>/` is
looked for below the current pipeline root. When the latest blessed model's folders are gone
altogether, a run must not carry on as if there were none: the Evaluator would bless the candidate
uncompared, and the gate would skip drift. BaselineError stops it, saying why.
"""

import os
import posixpath

from storage.files import is_remote


class BaselineError(RuntimeError):
    """The latest blessed model is recorded but cannot be read; the message is one line with the fix."""


def relocate(recorded: str, pipeline_root: str) -> str:
    """`recorded` if it exists (or is remote), else the same path below `pipeline_root` if that exists
    (matched on the root's last two folders, e.g. pipelines/<name>), else `recorded`."""
    if is_remote(recorded) or os.path.exists(recorded):
        return recorded
    anchor = "/" + "/".join(pipeline_root.rstrip("/").split("/")[-2:]) + "/"
    path = "/" + recorded.replace(os.sep, "/")
    at = path.rfind(anchor)
    if at < 0:
        return recorded
    moved = os.path.join(pipeline_root, *path[at + len(anchor) :].split("/"))
    return moved if os.path.exists(moved) else recorded


def pipeline_root_of(artifact_uri: str) -> str:
    """The pipeline root of a local artifact written by this run: <root>/<Component>/<output>/<id>."""
    path = artifact_uri.rstrip("/")
    for _ in range(3):
        path = posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)
    return path


def locate(recorded: str, this_run_artifact: str, what: str) -> str:
    """Where the latest blessed model's artifact `recorded` is now (relocate() from the pipeline root of
    `this_run_artifact`, an artifact of the running pipeline), or BaselineError naming `what`."""
    from tfx.dsl.io import fileio  # local or gs://; imported here: `imagepipe runs` relocates without TFX

    found = relocate(recorded, pipeline_root_of(this_run_artifact))
    if not fileio.exists(found):
        raise BaselineError(
            f"the last blessed model's {what} is missing ({recorded}): the root was moved without it, or its "
            "pipelines/ folder was deleted, so the new model cannot be compared with it; restore that folder, "
            "or start a new lineage with --name NEW (its runs and models are kept apart)"
        )
    return found
