"""This project's own artifact types.

TYPE_NAME is "components.<Class>": Kubeflow V2 / Vertex encode a custom type as
a schema title that must look like `module.Class` and that the container
imports back, so `components.<Class>` has to resolve (components/__init__.py).
"""

from tfx import types


class ImageIngestionReport(types.Artifact):
    """What ingestion did: summary.json (counts), quarantine.csv (files and reasons), label_map.json."""

    TYPE_NAME = "components.ImageIngestionReport"


class DataValidationResult(types.Artifact):
    """The validation gate's verdict: anomalies.json (one entry per anomaly) and a `passed` property."""

    TYPE_NAME = "components.DataValidationResult"


class DataHealthReport(types.Artifact):
    """Data health (components/health): health.json, label_issues.csv, outliers.csv."""

    TYPE_NAME = "components.DataHealthReport"


class ModelCard(types.Artifact):
    """A model's card (components/model_card): model_card.json, .md, .html and threshold.json."""

    TYPE_NAME = "components.ModelCard"
