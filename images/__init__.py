"""The project's image library, under the stages: what ingestion, Transform, the features step, prediction, the
report and review all do with an image file. Pillow and numpy, no TFX; decoding.py alone imports TensorFlow.

bounds.py           the bounds on an image: its pixels (MAX_PIXELS), its file's size, decoding's memory at once
image_check.py      a file opened under the pixel bound, decoded once, its format and size checked, a bounded copy
                    stored above --store-max-pixels; the quarantine reasons (Reason) and rows (bad_row)
decoding.py         the one TensorFlow decode and resize (Transform, serving, TFLite prediction)
finding/            which files, with which labels and splits: the input's layouts, the listing, its types
feature_keys.py     the features of each tf.train.Example ingestion writes
example_codec.py    the tf.Example written without TensorFlow (its wire format)
tfrecord_io.py      gzip TFRecords written and read without TensorFlow, at a chosen deflate level
near_duplicates/    each image's perceptual signature, the distance between two, and the groups among many
"""
