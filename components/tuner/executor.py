"""ImageTuner's executor: search (here, or as a Vertex AI Training job) or hand on the last search's values.

The search itself is TFX's: tfx.components.tuner.executor.search() with trainer.search.tuner_fn, and
write_best_hyperparameters() (best_hyperparameters.txt, tuner_results.json). On Vertex AI, with the
Vertex settings in custom_config, TFX's Vertex Tuner extension runs it as a custom job whose workers run
trials in parallel (TuneArgs.num_parallel_trials) against a chief oracle; its files come back the same.

Then search.json (components/tuner SEARCH_FILE, in tuner_results) records the trials in the order they
ran, the best values and TFX's config of them, and what the search depended on (decision.profile);
tuning.json (DECISION_FILE) what this run did and why. When decision.decide() finds nothing changed, the
last search's values and records are handed on instead.
"""

import contextlib
import datetime
import io
import json
import os
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf
import tensorflow_transform as tft
from absl import logging
from tensorflow.python.framework import config as tf_config  # disable_op_determinism is not public
from tfx import types
from tfx.components.tuner import executor as tuner_executor
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.extensions.google_cloud_ai_platform import constants
from tfx.extensions.google_cloud_ai_platform.tuner import executor as vertex_tuner
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils, json_utils

from components.example_gen import SUMMARY_FILE as INGESTION_SUMMARY
from components.trainer.component import with_settings
from components.tuner import DECISION_FILE, SEARCH_FILE, decision
from storage.relocation import pipeline_root_of, relocate
from trainer import features
from trainer import search as tuning
from trainer.artifact_files import FEATURE_PROFILE_FILE, FEATURES_SOURCE_FILE
from trainer.hparams import HParams

BEST_FILE = "best_hyperparameters.txt"  # TFX's names (tfx/components/tuner/executor.py)
RESULTS_FILE = "tuner_results.json"
TRIALS, MODE, PIPELINE = "tune_trials", "tune_mode", "pipeline"  # the settings' names (components/tuner Search)
# Their names in jobs compiled before the trial count had one name: such jobs' runs still search.
EARLIER_NAMES = {TRIALS: "trials", MODE: "mode"}
SEARCHED = "searched"  # custom property of both outputs: 1 when this run searched, 0 when it reused a search
LIMITS = ("max_class_drift", "max_feature_drift")


def _read_json(path: str) -> Optional[Any]:
    return json.loads(io_utils.read_string_file(path)) if fileio.exists(path) else None


def _features(examples: types.Artifact) -> Optional[Dict[str, Any]]:
    """The features step's fingerprint and profile, when the Tuner's examples are its output."""
    source = _read_json(os.path.join(examples.uri, FEATURES_SOURCE_FILE))
    if source is None:
        return None
    return {
        "fingerprint": source.get("fingerprint"),
        "profile": _read_json(os.path.join(examples.uri, FEATURE_PROFILE_FILE)),
    }


def _classes(transform_graph: types.Artifact) -> List[str]:
    return [
        n.decode() for n in tft.TFTransformOutput(transform_graph.uri).vocabulary_by_name(features.LABEL_VOCABULARY)
    ]


def _trials_in_order(results_uri: str) -> List[Dict[str, Any]]:
    """TFX's tuner_results.json (completed trials, best first) in the order the trials ran."""
    rows = _read_json(os.path.join(results_uri, RESULTS_FILE)) or []
    ordered = []
    for row in sorted(rows, key=lambda r: str(r.get("trial_id"))):
        values = {k: v for k, v in row.items() if k not in ("trial_id", "score")}
        ordered.append(
            {"trial": len(ordered) + 1, "trial_id": row.get("trial_id"), "score": row.get("score"), "values": values}
        )
    return ordered


# What tuning.json repeats of the search it used (this run's or the last one's), for the summary and the report.
DECISION_COPIES = ("searched_at", "algorithm", "objective", "best", "best_score", "results", "space", "model")


def _this_search(input_dict, exec_properties, hp: HParams, trials: int):
    """The ingestion summary, and what this search would be: its data, settings and space (decision.profile)."""
    examples = artifact_utils.get_single_instance(input_dict[standard_component_specs.EXAMPLES_KEY])
    report = artifact_utils.get_single_instance(input_dict["ingestion_report"])
    summary = json.loads(io_utils.read_string_file(os.path.join(report.uri, INGESTION_SUMMARY)))
    train_counts = (summary.get("examples_per_split_and_class") or {}).get("train", {})
    current = decision.profile(
        hp,
        trials,
        exec_properties[PIPELINE],
        _classes(artifact_utils.get_single_instance(input_dict[standard_component_specs.TRANSFORM_GRAPH_KEY])),
        train_counts,
        _features(examples),
        tuning.space_names(hp),
        tuning.SPACE_VERSION,
    )
    return summary, current


def _searched(current, summary, best_uri: str, results_uri: str, started: float) -> Dict[str, Any]:
    """search.json of the search this run made: its profile, best values and every trial in the order they ran."""
    best_config = json.loads(io_utils.read_string_file(os.path.join(best_uri, BEST_FILE)))
    ordered = _trials_in_order(results_uri)
    scores = [t["score"] for t in ordered if t["score"] is not None]
    train_counts = (summary.get("examples_per_split_and_class") or {}).get("train", {})
    return {
        **current,
        "searched_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "algorithm": tuning.ALGORITHM,
        "objective": tuning.objective_for(train_counts, multi_label=summary.get("task") == "multi"),
        "best": tuning.values_of(best_config),
        "best_config": best_config,
        "best_score": max(scores) if scores else None,
        "results": ordered,
        "seconds": round(time.monotonic() - started, 2),
    }


class Executor(base_executor.BaseExecutor):
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        started = time.monotonic()
        # A run's epochs (a compiled job's runtime parameter) reach the trials as they reach the Trainer.
        exec_properties = with_settings(exec_properties)
        exec_properties = {
            **{new: exec_properties[old] for new, old in EARLIER_NAMES.items() if old in exec_properties},
            **exec_properties,
        }
        config = json_utils.loads(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY) or "null") or {}
        hp = HParams.from_custom_config(config)
        trials = int(exec_properties[TRIALS])
        if trials < 1:
            raise ValueError(f"tune_trials {trials}: use 1 or more trials")
        summary, current = _this_search(input_dict, exec_properties, hp, trials)
        best = artifact_utils.get_single_instance(output_dict[standard_component_specs.BEST_HYPERPARAMETERS_KEY])
        results = artifact_utils.get_single_instance(output_dict[standard_component_specs.TUNER_RESULTS_KEY])
        previous_artifact = (input_dict.get("previous") or [None])[0]
        previous_uri = relocate(previous_artifact.uri, pipeline_root_of(best.uri)) if previous_artifact else None
        previous = _read_json(os.path.join(previous_uri, SEARCH_FILE)) if previous_uri else None
        verdict = decision.decide(
            exec_properties[MODE], previous, current, *(float(exec_properties[k]) for k in LIMITS)
        )
        logging.info("Tuner: %s (%s)", "searching" if verdict.search else "reusing the last search", verdict.reason)

        if verdict.search:
            properties = dict(exec_properties)
            properties[standard_component_specs.CUSTOM_CONFIG_KEY] = json.dumps({**config, tuning.TRIALS_KEY: trials})
            self._search(input_dict, output_dict, properties, config, hp)
            record = _searched(current, summary, best.uri, results.uri, started)
        else:
            record = previous
            io_utils.write_string_file(os.path.join(best.uri, BEST_FILE), json.dumps(record["best_config"]))
            fileio.copy(
                os.path.join(previous_uri, RESULTS_FILE), os.path.join(results.uri, RESULTS_FILE), overwrite=True
            )
        io_utils.write_string_file(os.path.join(results.uri, SEARCH_FILE), json.dumps(record, indent=1))
        decided = {
            "searched": verdict.search,
            "reason": verdict.reason,
            "mode": exec_properties[MODE],
            "trials": trials,
            "reused_from": None if verdict.search else previous_uri,
            "seconds": round(time.monotonic() - started, 2),
            **{k: record.get(k) for k in DECISION_COPIES},
        }
        io_utils.write_string_file(os.path.join(results.uri, DECISION_FILE), json.dumps(decided, indent=1))
        for artifact in (best, results):
            artifact.set_int_custom_property(SEARCHED, int(verdict.search))

    def _search(self, input_dict, output_dict, exec_properties, config: Dict[str, Any], hp: HParams) -> None:
        if config.get(constants.ENABLE_VERTEX_KEY):
            # Trials as a Vertex AI Training job: TFX's Vertex Tuner extension, workers against a chief oracle.
            vertex_tuner.Executor(self._context).Do(input_dict, output_dict, exec_properties)
            return
        was_deterministic = tf_config.is_op_determinism_enabled()
        if hp.deterministic:  # the same data, settings and seed search the same trials, as training does
            tf.config.experimental.enable_op_determinism()
        printed = io.StringIO()  # KerasTuner prints its summaries: not into `imagepipe run`'s output
        try:
            with contextlib.redirect_stdout(printed):
                tuner = tuner_executor.search(input_dict, exec_properties, self._get_tmp_dir())
        finally:
            if not was_deterministic:
                tf_config.disable_op_determinism()
            logging.info("Tuner: KerasTuner said:\n%s", printed.getvalue())
        tuner_executor.write_best_hyperparameters(tuner, output_dict)
