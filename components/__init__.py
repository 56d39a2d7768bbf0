"""The stages of the DAG, a folder each, named as the DAG names them (pipeline/pipeline.py assembles them):

example_gen/   ImageExampleGen: image files -> tf.Examples, quarantine, splits, a profile of the data
validation/    StatisticsGen's settings for images; DataValidationGate: stops the run on anomalies or drift
transform/     Transform: preprocessing_fn (decode, resize, label ids), records stored undeflated
features/      BackboneFeatures: the transfer models' backbone run once per image, cached across runs
health/        DataHealth: likely label errors, outliers, feature drift; DataHealthGate gates on them
tuner/         ImageTuner: the hyperparameter search (trainer/search.py), only when the data or settings moved
trainer/       ImageTrainer: TFX's Trainer running trainer/task.py's run_fn, with runtime parameters
evaluator/     ImageEvaluator: TFMA, every class (or label) judged, thresholds, explanations, test split
model_card/    ModelCard: a card with every model, from ML Metadata and the artifacts
pusher/        ImagePusher: a blessed model pushed with its card

Each stage's summary.py reads its outputs back for the run summary and the report (runs/run_summary.py).
Shared by several stages: drift.py (the data profile and its drift), beam_settings.py (TFX's Beam executors on
examples of megabytes), beam_dependencies.py (no TFX package built for a Beam runner on this machine),
beam_overheads.py (Beam's costs for every transform, cut), summary_reading.py (what the summary readers share). The
model code they run is trainer/; files and artifact types, storage/.
"""

_ARTIFACTS = ("ImageIngestionReport", "DataValidationResult", "DataHealthReport", "ModelCard")


def __getattr__(name):
    if name in _ARTIFACTS:
        # Artifact types resolve as components.<Class>, the TYPE_NAME that ML Metadata and compiled jobs recorded
        # (storage/artifact_types.py), imported only when asked for: ingestion worker processes import
        # components.* and must not pay for TFX's import.
        from storage import artifact_types

        return getattr(artifact_types, name)
    raise AttributeError(f"module 'components' has no attribute {name!r}")
