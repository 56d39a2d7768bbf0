"""Names of files that components and the Trainer write into their output artifacts, and that
pipeline/ reads back (run summaries, reports, warm starts) without importing TFX or TensorFlow.
ImageExampleGen's own report files are named in components/image_example_gen/__init__.py.
"""

# DataValidationGate's `result` (components/validation_gate.py)
GATE_RESULT_FILE = "anomalies.json"  # the anomalies the gate judged
GATE_DRIFT_FILE = "drift.json"  # the drift checks against the last blessed model's data

# The Trainer (trainer/task.py): in the model_run folder, and beside Format-Serving in the Model artifact
TRAINING_LOG = "training.json"  # per-epoch metrics, strategy, hyperparameters, TFLite scores
KERAS_DIR = "keras"  # the weights warm starts and the TFLite export load
WEIGHTS_FILE = "model.weights.h5"
INFO_FILE = "model_info.json"  # classes, model and input shape the weights fit
