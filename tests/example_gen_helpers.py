"""Runs the real ImageExampleGen executor (real Beam, real files) and reads its output with TensorFlow."""

import collections
import csv
import json
import os
import sys
from typing import Dict, List

import tensorflow as tf
from tfx.types import standard_artifacts
from tfx.utils import proto_utils

from components.example_gen import QUARANTINE_FILE, executor, ingest_report
from components.example_gen.component import ImageExampleGen, ImageIngestionReport


def run_executor(input_base: str, out_dir: str, beam_args=None, **component_args):
    """Runs Executor.Do as the TFX launcher would (exec properties as JSON); returns the artifacts."""
    component = ImageExampleGen(input_base=str(input_base), **component_args)
    props = {
        k: proto_utils.proto_to_json(v) if hasattr(v, "DESCRIPTOR") else v
        for k, v in component.exec_properties.items()
        if v is not None
    }
    examples = standard_artifacts.Examples()
    examples.uri = os.path.join(str(out_dir), "examples")
    report = ImageIngestionReport()
    report.uri = os.path.join(str(out_dir), "report")
    os.makedirs(examples.uri, exist_ok=True)
    os.makedirs(report.uri, exist_ok=True)
    context = executor.Executor.Context(beam_pipeline_args=beam_args or [], tmp_dir=str(out_dir))
    executor.Executor(context).Do({}, {"examples": [examples], "report": [report]}, props)
    return examples, report


def read_examples(examples_uri: str) -> Dict[str, List[Dict]]:
    """{split: [features as python values]} read back with TensorFlow's own TFRecord reader."""
    out = collections.defaultdict(list)
    for split_dir in sorted(os.listdir(examples_uri)):
        if not split_dir.startswith("Split-"):
            continue
        files = sorted(tf.io.gfile.glob(os.path.join(examples_uri, split_dir, "*.gz")))
        for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
            example = tf.train.Example.FromString(record.numpy())
            features = {}
            for key, feature in example.features.feature.items():
                kind = feature.WhichOneof("kind")
                values = list(getattr(feature, kind).value)
                features[key] = values[0] if len(values) == 1 else values
            out[split_dir[len("Split-") :]].append(features)
    return dict(out)


def by_filename(examples: Dict[str, List[Dict]]) -> Dict[str, Dict]:
    return {e["image/filename"].decode(): {**e, "split": split} for split, es in examples.items() for e in es}


def quarantine(report_uri: str) -> Dict[str, Dict[str, str]]:
    with open(os.path.join(report_uri, QUARANTINE_FILE), newline="") as f:
        return {row["path"]: row for row in csv.DictReader(f)}


def summary(report_uri: str) -> Dict:
    return ingest_report.read_report(report_uri)


def ingest_main() -> None:
    """sys.argv INPUT OUT: runs the executor on INPUT (max_bad_fraction 1.0) into OUT and prints one JSON line:
    the summary, the quarantine, and each split's sorted (file name, label) pairs. For a test that ingests in a
    process of its own, with another environment (conftest.run_helper)."""
    source, out = sys.argv[1:3]
    examples, report = run_executor(source, out, max_bad_fraction=1.0)
    found = read_examples(examples.uri)
    print(
        json.dumps(
            {
                "summary": summary(report.uri),
                "quarantine": quarantine(report.uri),
                "examples": {
                    split: sorted([e["image/filename"].decode(), e["image/class/label"]] for e in es)
                    for split, es in found.items()
                },
            }
        )
    )
