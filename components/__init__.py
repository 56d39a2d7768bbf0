"""Custom TFX components and executors.

image_example_gen/   ImageExampleGen: image files -> tf.Examples, and a profile of the data
validation_gate.py   DataValidationGate: stops the run on anomalies or drift (drift.py)
backbone_features/   BackboneFeatures: the transfer models' backbone run once per image, cached
data_health/         DataHealth: likely label errors, outliers, feature drift; gates on them
tuning/              ImageTuner: the hyperparameter search, only when the data or settings moved
runtime_settings.py  the Trainer and Evaluator with the settings a compiled job's runs can change
model_evaluator.py   the Evaluator's executor: no comparison across class changes, threshold views, test split
evaluation_metrics.py  per-class recall and precision and balanced accuracy as TFMA metrics; the class gate's specs
evaluation_views.py  precision, recall and coverage at confidence thresholds (plain Python)
evaluation_results.py  what the Evaluator found, read back from its artifact
model_card/          ModelCard: a card with every model, from ML Metadata and the artifacts; ImagePusher
beam_tuning.py       StatisticsGen, Transform and Evaluator executors tuned for large examples
"""

_ARTIFACTS = ("ImageIngestionReport", "DataValidationResult", "DataHealthReport", "ModelCard")


def __getattr__(name):
    # Artifact types resolve as components.<Class> (see artifacts.py), imported only when asked
    # for: ingestion worker processes import components.* and must not pay for TFX's import.
    if name in _ARTIFACTS:
        from components import artifacts

        return getattr(artifacts, name)
    raise AttributeError(f"module 'components' has no attribute {name!r}")
