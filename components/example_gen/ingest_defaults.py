"""ImageExampleGen's settings, each declared once (settings.setting()).

`Ingestion` makes PipelineConfig's fields (and their IMAGEPIPE_ variables and checks), the `imagepipe run` options,
ImageExampleGen's parameters (component.py) and what its executor reads (ingest_settings.py). Plain Python: the CLI
imports it without TFX.
"""

import dataclasses
from typing import Optional

from images.bounds import MAX_PIXELS
from images.finding import LAYOUTS
from settings import fraction, setting

# single-label (a class an image) or multi-label (any number of labels an image, none included); auto: multi-label
# when a row names several labels, the manifest has a `labels` column, or the import file is AutoML's multi-label
# kind (classificationAnnotations). Class folders are single-label.
TASKS = ("auto", "single", "multi")
# Near-duplicates (resized, recompressed, slightly cropped copies): "report" them, "drop" all but one
# copy of each group with one label (images/near_duplicates/grouping.py), or "off": no signatures and no search, for a set
# already deduplicated (ingestion ~1.8x faster; docs/benchmarks.md), and data health then cannot check leaks.
NEAR_DUPLICATE_MODES = ("report", "drop", "off")


@dataclasses.dataclass(frozen=True)
class Ingestion:
    """What ImageExampleGen reads and how it writes. Files are ingested in an order shuffled with the run's seed
    (--seed, trainer/hparams.py), never in the listing's class-folder order."""

    # folders, presplit or manifest, told apart by what the data holds (images/finding/sources.py)
    layout: str = setting("auto", "input layout (default {default})", LAYOUTS)
    # Span pattern below `data` for new data drops, e.g. "span-{SPAN}": the latest span is read, with the
    # span_window - 1 spans before it.
    span_pattern: Optional[str] = setting(
        None,
        "read the latest span below --data, e.g. 'span-{{SPAN}}'",
        check=(lambda v: "{SPAN}" in v, "it must contain {SPAN}, e.g. span-{SPAN}"),
    )
    span_window: int = setting(
        1,
        "with --span-pattern: read the latest span and the N-1 spans before it (default {default})",
        check=(lambda v: v >= 1, "use 1 or more spans"),
        runtime="span_pattern",
    )
    eval_percent: int = setting(
        20,
        "eval share of unsplit data, by content hash (default {default})",
        check=(lambda v: 1 <= v <= 99, "use a whole number from 1 to 99"),
    )
    max_pixels: int = setting(
        MAX_PIXELS,
        "quarantine larger images (default {default:,})",
        check=(lambda v: v >= 1, "use a positive number of pixels"),
    )
    # Larger images are stored as a downscaled copy, aspect kept, with the original's size and hash in the example.
    # A 12 MP phone photo is stored at 1008x756.
    store_max_pixels: int = setting(
        2_000_000,
        "store images above this many pixels as a downscaled copy (aspect kept; 0: store originals; "
        "default {default:,})",
        check=(lambda v: v >= 0, "use a number of pixels, or 0 to store every original"),
    )
    max_bad_fraction: float = setting(
        0.1, "fail when more files than this are bad (default {default})", check=fraction()
    )
    drop_duplicates: bool = setting(False, "keep one copy of identical files (default: keep all, in one split)")
    near_duplicates: str = setting(
        "report",
        "near-duplicate images (resized, recompressed, slightly cropped copies): report them, drop all but one "
        "copy of each group with one label, or off: no search (ingestion ~1.8x faster; eval leaks go unchecked); "
        "default {default}",
        NEAR_DUPLICATE_MODES,
    )
    task: str = setting(
        "auto",
        "single-label (a class an image) or multi-label (any number of labels an image, none included); auto: "
        "multi-label when a manifest has a labels column (path,labels, separated by ';'), a row names several "
        "labels, or the import file is AutoML's multi-label kind; default {default}. Class folders are "
        "single-label",
        TASKS,
    )
    # A review file whose relabels and exclusions apply, by content hash (review/, storage/review_file.py).
    review: str = setting(
        "",
        "a review file (`imagepipe review` writes it): relabelled images train with their new label, excluded "
        "ones are quarantined (excluded_by_review); matched by content hash",
    )
    # gzip level of the TFRecords; 0 suits JPEG/PNG, which deflate shrinks by ~1% at a large CPU cost
    compression_level: int = setting(
        0,
        "gzip level of the TFRecords (default {default}; 0: stored)",
        check=(lambda v: 0 <= v <= 9, "use 0 (none) to 9"),
    )
    shard_megabytes: int = setting(
        64, "TFRecord shards rotate at about this size", flag=None, check=(lambda v: v >= 1, "use 1 or more")
    )


# The settings ImageExampleGen takes in TFX's own configs rather than as parameters of its own:
# eval_percent in output_config (hash_split_output), span_pattern in input_config.
IN_TFX_CONFIGS = ("eval_percent", "span_pattern")
PARAMETERS = [f for f in dataclasses.fields(Ingestion) if f.name not in IN_TFX_CONFIGS]


def hash_split_output(eval_percent: int = Ingestion.eval_percent):
    """ExampleGen's output_config for unsplit data: train and eval by content hash, in percent buckets."""
    from tfx.proto import example_gen_pb2  # protos only (no TensorFlow): the CLI stays fast

    return example_gen_pb2.Output(
        split_config=example_gen_pb2.SplitConfig(
            splits=[
                example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=100 - eval_percent),
                example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=eval_percent),
            ]
        )
    )
