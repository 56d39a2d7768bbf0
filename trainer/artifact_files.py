"""Names of the files in the artifacts the model code writes or reads, read back by the later stages, the run
summary, the report and predict (without importing TFX or TensorFlow).
"""

# The Trainer (trainer/task.py): in the model_run folder, and beside Format-Serving in the Model artifact
TRAINING_LOG = "training.json"  # per-epoch metrics, strategy, hyperparameters, TFLite scores
KERAS_DIR = "keras"  # the weights warm starts and the TFLite export load
WEIGHTS_FILE = "model.weights.h5"
INFO_FILE = "model_info.json"  # classes, model and input shape the weights fit
# a multi-label model's threshold per label, chosen on held-out train images (trainer/operating_point.py)
LABEL_THRESHOLDS_FILE = "label_thresholds.json"
# beside keras/: a single-label model's head alone, when its backbone is the features step's (trainer/head_export.py)
HEAD_DIR = "features_head"
HEAD_INFO = "head.json"  # in HEAD_DIR: the features it reads (the features step's fingerprint, dim)

# BackboneFeatures' `features` (components/features writes them; the Trainer, the Tuner and data health read them)
FEATURES_SOURCE_FILE = "source.json"  # the Transform output the pixels came from, the backbone weights, dim, views
# the backbone's weights, copied from the features cache: the artifact holds what reading it needs, so a cache
# cleared (`imagepipe cache --clear`) under TFX's reuse of the artifact leaves the Trainer its backbone
FEATURES_WEIGHTS_FILE = "backbone.weights.h5"
# The mean and standard deviation of each feature over the training split: the Trainer keeps it with the
# model, and the next run's data health check measures drift in feature space against it.
FEATURE_PROFILE_FILE = "feature_profile.json"
