"""Names of files that one stage writes into its output artifacts and other stages, the Trainer, the run summary
and the report read back (without importing TFX or TensorFlow).
ImageExampleGen's own report files are named in components/example_gen/__init__.py.
"""

# BackboneFeatures' `features` (components/features): read by the Trainer, the Tuner and data health
FEATURES_SOURCE_FILE = "source.json"  # the Transform output the pixels came from, the backbone weights, dim, views
# The mean and standard deviation of each feature over the training split: the Trainer keeps it with the
# model, and the next run's data health check measures drift in feature space against it.
FEATURE_PROFILE_FILE = "feature_profile.json"

# DataValidationGate's `result` (components/validation/gate.py)
GATE_RESULT_FILE = "anomalies.json"  # the anomalies the gate judged
GATE_DRIFT_FILE = "drift.json"  # the drift checks against the last blessed model's data

# The Trainer (trainer/task.py): in the model_run folder, and beside Format-Serving in the Model artifact
TRAINING_LOG = "training.json"  # per-epoch metrics, strategy, hyperparameters, TFLite scores
KERAS_DIR = "keras"  # the weights warm starts and the TFLite export load
WEIGHTS_FILE = "model.weights.h5"
INFO_FILE = "model_info.json"  # classes, model and input shape the weights fit
