"""BackboneFeatures: the frozen backbone run once per image, its pooled output kept as TFRecord examples.

component.py       the TFX component (between Transform and the Trainer, for the transfer models)
executor.py        its Beam graph: pixels -> features, through the cache
backbone.py        the backbone as the run makes it: fingerprint and weights file
runtimes.py        which runtime runs its frozen graph: ONNX Runtime on CPUs, TensorFlow beside a GPU or TPU
feature_cache.py   the content-addressed cache under the pipeline root (plain Python)

Files in the output artifact, read without TFX: summary.json (the run summary), and source.json and
feature_profile.json, which other stages and the model code read (trainer/artifact_files.py names them).
"""

SUMMARY_FILE = "summary.json"  # images, features reused and computed, seconds
