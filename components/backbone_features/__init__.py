"""BackboneFeatures: the frozen backbone run once per image, its pooled output kept as TFRecord examples.

component.py       the TFX component (between Transform and the Trainer, for the transfer models)
executor.py        its Beam graph: pixels -> features, through the cache
backbone.py        the backbone as the run makes it: fingerprint and weights file
feature_cache.py   the content-addressed cache under the pipeline root (plain Python)

Files in the output artifact, read by the Trainer and the run summary without TFX:
"""

SOURCE_FILE = "source.json"  # the Transform output the pixels came from, the backbone weights, dim, views
SUMMARY_FILE = "summary.json"  # images, features reused and computed, seconds
# The mean and standard deviation of each feature over the training split: the Trainer keeps it with the
# model, and the next run's data health check measures drift in feature space against it.
PROFILE_FILE = "feature_profile.json"
