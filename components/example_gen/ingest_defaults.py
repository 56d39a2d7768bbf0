"""ImageExampleGen's defaults, defined once.

The component's parameters, the executor's fallbacks (for a parameter that a compiled pipeline
leaves out), pipeline/config.py's settings (and so the CLI's help) and `imagepipe predict` all read
these. Plain Python: the CLI imports it without TFX.
"""

# Files are ingested (and so written, and read by Transform and the Trainer) in an order shuffled with the run's
# seed (--seed; its one default is trainer/hparams.py's), never in the listing's class-folder order.
from trainer.hparams import SEED  # noqa: F401

LAYOUT = "auto"  # folders, presplit or manifest, told apart by what the data holds (sources.py)
LAYOUTS = ("auto", "folders", "presplit", "manifest", "automl")
# single-label (a class an image) or multi-label (any number of labels an image, none included); auto: multi-label
# when a row names several labels, the manifest has a `labels` column, or the import file is AutoML's multi-label
# kind (classificationAnnotations). Class folders are single-label.
TASKS = ("auto", "single", "multi")
TASK = "auto"
MAX_PIXELS = 50_000_000  # width * height * frames; larger files are quarantined (decompression bombs)
# Larger images are stored as a downscaled copy, aspect kept, with the original's size and hash in
# the example; 0 stores every original. A 12 MP phone photo is stored at 1008x756.
STORE_MAX_PIXELS = 2_000_000
MAX_BAD_FRACTION = 0.1  # the run fails when more of the files than this are bad
EVAL_PERCENT = 20  # unsplit data: the eval share, by content hash
SHARD_MEGABYTES = 64  # TFRecord shards rotate at about this size
COMPRESSION_LEVEL = 0  # gzip level of the TFRecords; 0 suits JPEG/PNG, which do not compress
DROP_DUPLICATES = False  # keep one copy of identical files (same label)
# Near-duplicates (resized, recompressed, slightly cropped copies): "report" them, "drop" all but one
# copy of each group with one label (near_duplicates.py), or "off": no signatures and no search, for a set
# already deduplicated (ingestion ~1.8x faster; docs/benchmarks.md), and data health then cannot check leaks.
NEAR_DUPLICATE_MODES = ("report", "drop", "off")
NEAR_DUPLICATES = "report"
SPAN_WINDOW = 1  # spans read: the latest and the SPAN_WINDOW - 1 before it


def hash_split_output(eval_percent: int = EVAL_PERCENT):
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
