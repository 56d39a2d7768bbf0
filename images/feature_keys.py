"""The features of each tf.train.Example that ImageExampleGen writes (docs/data.md: What ingestion writes).

One list for the writer (batch_ingest.py), the Trainer (trainer/features.py) and the report. Plain
Python, no TensorFlow.
"""

ENCODED = "image/encoded"  # the original bytes, or a downscaled copy above --store-max-pixels
FORMAT = "image/format"  # of the stored bytes: jpeg or png
HEIGHT = "image/height"  # of the stored image
WIDTH = "image/width"
CHANNELS = "image/channels"
ORIGINAL_HEIGHT = "image/original/height"  # of the file as it was found
ORIGINAL_WIDTH = "image/original/width"
LABEL = "image/class/label"  # the class id in ImageExampleGen's label map
LABEL_TEXT = "image/class/text"  # the class name
# Multi-label examples (--task multi) carry these instead of LABEL and LABEL_TEXT: every label of the image, in name
# order, none when no label applies. Keys of their own: a schema, Transform and the Trainer know from the features
# alone which task the examples are for, and a single-label schema flags multi-label data as an anomaly.
LABELS = "image/labels/id"  # the ids in ImageExampleGen's label map
LABELS_TEXT = "image/labels/text"  # the names
FILENAME = "image/filename"  # relative to the data root
SHA256 = "image/key/sha256"  # of the original file: splits and duplicates follow it
SIGNATURE = "image/hash/perceptual"  # hex: pHash and dHash of the image's centre at 3 scales (similarity.py)
