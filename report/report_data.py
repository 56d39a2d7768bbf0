"""What the HTML report shows beyond run_summary's details, read from a run's artifacts: the
quarantine list, TFDV's anomaly, schema and statistics protos, the training log, the Evaluator's
threshold. report.py only presents them (the eval images the model gets wrong are the Evaluator's record).
"""

import glob
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from tensorflow_metadata.proto.v0 import anomalies_pb2

from storage.files import is_remote
from storage.spreadsheet import read_rows
from trainer.artifact_files import TRAINING_LOG

IMAGE_READ_LIMIT = 8 << 20  # bytes of a quarantined file read for its thumbnail


def quarantine(
    details: Dict[str, Any], input_base: str, rows: int
) -> Tuple[List[Dict], int, Iterator[Tuple[Dict, bytes]]]:
    """(the first `rows` rows of the quarantine list, how many there are, and lazily, each of those rows
    whose file is still on local disk with the file's bytes)."""
    with open(details["quarantine_csv"], newline="", encoding="utf-8") as f:
        listed = read_rows(f.read())
    shown = listed[:rows]

    return (
        shown,
        len(listed),
        ((row, data) for row in shown for data in [input_file(input_base, row["path"])] if data is not None),
    )


def input_file(input_base: str, rel_path: str) -> Optional[bytes]:
    """The first bytes of an input file still on local disk (for a thumbnail), or None."""
    path = os.path.join(input_base, rel_path)
    if not input_base or is_remote(input_base) or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as image:
            return image.read(IMAGE_READ_LIMIT)
    except OSError:
        return None


def anomalies(anomalies_uri: str) -> Iterator[Tuple[str, Any]]:
    """(split, tensorflow_metadata Anomalies) for every split ExampleValidator found anomalies in."""
    for pb in sorted(glob.glob(os.path.join(anomalies_uri, "Split-*", "SchemaDiff.pb"))):
        with open(pb, "rb") as f:
            proto = anomalies_pb2.Anomalies.FromString(f.read())
        if proto.anomaly_info or proto.HasField("dataset_anomaly_info"):
            yield os.path.basename(os.path.dirname(pb))[len("Split-") :], proto


def schema(schema_path: Optional[str]):
    """The schema proto the run validated against, or None."""
    if not schema_path or not os.path.exists(schema_path):
        return None
    import tensorflow_data_validation as tfdv  # TFDV, TensorFlow (~5 s): only a run with a schema needs it

    return tfdv.load_schema_text(schema_path)


def statistics(statistics_uri: str) -> Iterator[Tuple[str, Any]]:
    """(split, DatasetFeatureStatistics) from StatisticsGen's output."""
    import tensorflow_data_validation as tfdv  # TFDV, TensorFlow (~5 s): only a run with statistics needs it

    for pb in sorted(glob.glob(os.path.join(statistics_uri, "Split-*", "FeatureStats.pb"))):
        yield os.path.basename(os.path.dirname(pb))[len("Split-") :], tfdv.load_stats_binary(pb).datasets[0]


def training_log(model_run: str) -> Dict[str, Any]:
    with open(os.path.join(model_run, TRAINING_LOG)) as f:
        return json.load(f)
