"""The eval images the model gets wrong, recorded by the Evaluator for the report and the review page: the first MOST
misclassified eval records in order, found by the pass that classifies eval records for the explanations
(explanations.py: the model TFMA scored, the exported one or its head on the features; each record decoded at most
once, at most explanations.MAX_EXAMINED records). The
report used to load the serving model again to find them (~24 s at 224 px, and the model's memory in the run's
process after the Pusher); now it reads this. Written to the evaluation's misclassified/ folder:

  index.json   {"images": [{path, actual, predicted, probability, thumbnail}], "examined", "most",
                "reading_on_seconds": what reading on after the explanations' sample cost}
  NNNNN.png    each image at most THUMBNAIL_SIZE a side (None in index.json: it did not decode for a thumbnail)

A multi-label model's image is misclassified when its most likely label is none of its own.
"""

import json
import os
from typing import Any, Dict, List, Optional

from components.evaluator.results import INDEX_FILE, folder_index
from images import image_check
from images.bounds import MAX_PIXELS

MISCLASSIFIED_DIR = "misclassified"
MOST = 36  # misclassified images recorded (the report shows them all)
THUMBNAIL_SIZE = 80


class Found:
    """The misclassified rows met so far with their thumbnails (made as they are met: a full-size photo's bytes are
    not kept), MOST at most."""

    def __init__(self):
        self.rows: List[Dict[str, Any]] = []
        self.thumbnails: List[Optional[bytes]] = []

    def settled(self) -> bool:
        return len(self.rows) >= MOST

    def add(self, row: Dict[str, Any], encoded: bytes) -> None:
        if not row["correct"] and not self.settled():
            self.rows.append(row)
            self.thumbnails.append(image_check.thumbnail(encoded, THUMBNAIL_SIZE, MAX_PIXELS))


def write(found: Found, examined: int, reading_on: float, out_dir: str, write_file) -> Dict[str, Any]:
    """index.json and the thumbnails into out_dir with write_file(path, bytes) (local or gs://); returns the index.
    reading_on: the seconds the pass read on for this record alone, after the explanations' sample was settled."""
    images = []
    for n, (row, png) in enumerate(zip(found.rows, found.thumbnails), start=1):
        name = f"{n:05d}.png" if png else None
        if png:
            write_file(os.path.join(out_dir, name), png)
        images.append({**{k: row[k] for k in ("path", "actual", "predicted", "probability")}, "thumbnail": name})
    index = {"images": images, "examined": examined, "most": MOST, "reading_on_seconds": round(reading_on, 2)}
    write_file(os.path.join(out_dir, INDEX_FILE), json.dumps(index, indent=1).encode())
    return index


def read(evaluation_uri: str) -> Dict[str, Any]:
    """index.json of an evaluation's misclassified images (with "folder": where the thumbnails are), or {} when it has
    none (an older run)."""
    return folder_index(evaluation_uri, MISCLASSIFIED_DIR)
