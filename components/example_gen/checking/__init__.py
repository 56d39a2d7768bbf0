"""Checking and signing each image, in ingestion's worker processes (Pillow and numpy only).

image_check.py    a file opened under the pixel budget, decoded once, its format and size checked, a bounded copy
                  stored above --store-max-pixels; the quarantine reasons (Reason)
signature.py      the perceptual signature of an image (near-duplicates), made while it is decoded
similarity.py     the signature's parameters and the distances between signatures (the near-duplicate search's math)
example_codec.py  the tf.Example written without TensorFlow (its wire format)
"""
