"""The Evaluator's executor: TFX's (tuned, components/beam_settings.py), with additions for retraining and for
the views teams coming from Vertex AutoML expect.

- A baseline trained on other classes is not compared with. The latest blessed model of a
  pipeline may predict other classes than the candidate (a class added, removed or renamed in a
  later span): TFMA cannot score both on one label set (it fails inside a metric update), and the
  comparison would mean nothing. The candidate is then judged on the threshold alone, as on a first
  run, and the blessing's `baseline_skipped` property says why.
- The accuracy threshold can be a parameter of its own (`accuracy_threshold`, components/evaluator/component.py:
  a compiled job's runtime parameter); it replaces the lower bound of SparseCategoricalAccuracy's threshold
  in eval_config before TFMA reads it.
- Every class is judged (components/evaluator/metrics.py): TFMA computes each class's recall and precision
  and balanced accuracy, and blesses only a model whose recall reaches `min_class_recall` on every class with
  at least class_balance.MIN_EVAL_EXAMPLES eval images, and that finds some eval image of every class with at
  least class_balance.MIN_EVAL_TO_FIND. On an imbalanced train split (class_balance.py) the
  candidate is compared with the last blessed model on balanced accuracy instead of accuracy. class_gate.json
  in the evaluation says which classes were judged, on what counts, and what was compared.
- views.json (components/evaluator/views.py): precision, recall and coverage as the confidence threshold
  moves, overall and per class, and the threshold chosen for the model (`confidence_threshold`, or the
  lowest reaching `target_precision`), from TFMA's confusion matrices at thresholds.
- A `test` split (an AutoML import's TEST rows, a test/ folder) is scored too, apart: TFX's executor runs
  again on it, into the evaluation's test/ folder, with views at the eval split's chosen threshold. It
  blesses nothing: the blessing is the eval split's.
- The blessing keeps the data profile of the examples the model was judged on (ImageExampleGen's
  profile.json, train and eval). The next run's validation gate resolves the latest blessed model's
  blessing and compares its new data with this profile (components/drift.py): a reference that
  travels with the model, which works on Vertex AI, whose resolvers cannot look up older spans.
"""

import json
import os
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
from absl import logging
from tensorflow_model_analysis.proto import config_pb2 as tfma_config
from tfx.components.evaluator import constants
from tfx.components.evaluator import executor as evaluator_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.utils import io_utils, path_utils, proto_utils

from components.beam_settings import BeamConfigured, bytes_printed_as_sizes, smaller_batches
from components.evaluator import explanations as eval_explanations
from components.evaluator import metrics as evaluation_metrics
from components.evaluator import multi_label as multi_label_evaluation
from components.evaluator import on_features
from components.evaluator import predictions as prediction_records
from components.evaluator import results as evaluation_results
from components.evaluator import views as evaluation_views
from components.evaluator.eval_config import (
    ACCURACY_METRIC,
    BASELINE_SKIPPED,
    CLASS_GATE_FILE,
    CONFIDENCE,
    EXPLANATIONS,
    TARGET_PRECISION,
    TEST_SPLIT,
    THRESHOLD,
    class_gate,
    min_class_recall,
)
from components.example_gen import PROFILE_FILE
from storage.relocation import locate
from trainer import features, operating_point
from trainer.artifact_files import INFO_FILE, KERAS_DIR, LABEL_THRESHOLDS_FILE

# Written by the Trainer (trainer/task.py) beside Format-Serving: what the model predicts.
MODEL_INFO = os.path.join(KERAS_DIR, INFO_FILE)


def model_info(model_uri: str) -> Dict[str, Any]:
    """What the Trainer recorded of a Model artifact (class_names, task...); {} when it records nothing."""
    path = os.path.join(model_uri, MODEL_INFO)
    if not fileio.exists(path):
        return {}
    with fileio.open(path, "r") as f:
        return json.loads(f.read())


def held_out_thresholds(model_uri: str) -> Optional[Dict[str, Any]]:
    """The multi-label thresholds the Trainer chose on held-out train data (trainer/operating_point.py), or None."""
    path = os.path.join(model_uri, KERAS_DIR, LABEL_THRESHOLDS_FILE)
    if not fileio.exists(path):
        return None
    with fileio.open(path, "r") as f:
        return json.loads(f.read())


def class_change(baseline: Optional[List[str]], candidate: Optional[List[str]]) -> str:
    """Why these two models cannot be compared, or "" when they predict the same classes (or a model does
    not record its classes, as versions before model_info.json did: then TFMA compares them, and fails
    loudly if it cannot; never is such a candidate blessed uncompared)."""
    if baseline is None or candidate is None or baseline == candidate:
        return ""
    added = [c for c in candidate if c not in baseline]
    removed = [c for c in baseline if c not in candidate]
    parts = ([f"added {_names(added)}"] if added else []) + ([f"removed {_names(removed)}"] if removed else [])
    return (
        "the last blessed model was trained on other classes ("
        + (", ".join(parts) if parts else "same classes, other order")
        + ")"
    )


def _names(names: List[str], most: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def with_threshold(exec_properties):
    """exec_properties with eval_config's accuracy lower bound set to the `accuracy_threshold` parameter, if given."""
    threshold = exec_properties.get(THRESHOLD)
    if threshold is None:
        return exec_properties
    key = standard_component_specs.EVAL_CONFIG_KEY
    config = proto_utils.json_to_proto(exec_properties[key], tfma_config.EvalConfig())
    for spec in config.metrics_specs:
        for metric in spec.metrics:
            if metric.class_name == ACCURACY_METRIC:
                metric.threshold.value_threshold.lower_bound.value = float(threshold)
    return {**exec_properties, key: proto_utils.proto_to_json(config)}


def split_examples(examples, split: str) -> Optional[int]:
    """The images in a split of ImageExampleGen's output (its profile.json; None for a profile written before it
    counted them)."""
    profile_path = os.path.join(examples.uri, PROFILE_FILE)
    if not fileio.exists(profile_path):
        return None
    with fileio.open(profile_path, "r") as f:
        found = (json.loads(f.read()).get("examples_per_split") or {}).get(split)
    return None if found is None else int(found)


def split_class_counts(examples, split: str) -> Dict[str, int]:
    """Examples per class name in a split of ImageExampleGen's output: from its profile.json, or for examples
    written before the profile kept splits apart, counted from the records (class names only)."""
    profile_path = os.path.join(examples.uri, PROFILE_FILE)
    if fileio.exists(profile_path):
        with fileio.open(profile_path, "r") as f:
            per_split = json.loads(f.read()).get("classes_per_split")
        if per_split is not None:
            return dict(per_split.get(split, {}))
    files = fileio.glob(os.path.join(artifact_utils.get_split_uri([examples], split), "*"))
    counts: Dict[str, int] = {}
    spec = {features.LABEL_TEXT_KEY: tf.io.FixedLenFeature([], tf.string, default_value="")}
    for batch in tf.data.TFRecordDataset(files, compression_type=features.compression(files)).batch(1024):
        for name in tf.io.parse_example(batch, spec)[features.LABEL_TEXT_KEY].numpy():
            counts[name.decode("utf-8", "replace")] = counts.get(name.decode("utf-8", "replace"), 0) + 1
    return counts


def with_class_checks(
    exec_properties, names: List[str], eval_counts: Dict[str, int], train_counts: Dict[str, int]
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """exec_properties with eval_config's per-class metrics and floors (components/evaluator/metrics.py), and
    what class_gate.json records: which classes are judged, on what counts, and what the baseline is compared on."""
    floor = min_class_recall(exec_properties)
    gate = class_gate(names, eval_counts, train_counts, floor)
    imbalanced = gate["imbalanced"]
    key = standard_component_specs.EVAL_CONFIG_KEY
    config = proto_utils.json_to_proto(exec_properties[key], tfma_config.EvalConfig())
    if imbalanced:  # the baseline is compared on balanced accuracy instead
        for spec in config.metrics_specs:
            for metric in spec.metrics:
                if metric.class_name == ACCURACY_METRIC:
                    metric.threshold.ClearField("change_threshold")
    config.metrics_specs.extend(
        evaluation_metrics.class_specs(
            gate["eval_examples"], gate["judged"], floor, compare_balanced=imbalanced, must_find=gate["must_find"]
        )
    )
    gate["compared_on"] = "balanced_accuracy" if imbalanced else "accuracy"
    return {**exec_properties, key: proto_utils.proto_to_json(config)}, gate


def with_label_checks(
    exec_properties,
    names: List[str],
    eval_counts: Dict[str, int],
    train_counts: Dict[str, int],
    compare: bool,
    eval_images: Optional[int] = None,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """exec_properties with a multi-label eval config (components/evaluator/multi_label.py), and what
    class_gate.json records: which labels are judged at their thresholds, on what counts, and the macro bound."""
    floor = min_class_recall(exec_properties)
    key = standard_component_specs.EVAL_CONFIG_KEY
    config, bound = multi_label_evaluation.eval_config_for(
        proto_utils.json_to_proto(exec_properties[key], tfma_config.EvalConfig()),
        len(names),
        compare,
        exec_properties.get(CONFIDENCE),
        [int(eval_counts.get(name, 0)) for name in names],
        eval_images,
    )
    gate = multi_label_evaluation.label_gate(names, eval_counts, train_counts, floor, bound, compare, eval_images)
    return {**exec_properties, key: proto_utils.proto_to_json(config)}, gate


def _comparable_baseline(input_dict, candidate, info: Dict[str, Any], names: Optional[List[str]]):
    """(input_dict, why the baseline is not compared: "" when it is): a baseline trained on other classes, or for
    the other task, leaves input_dict without it."""
    key = standard_component_specs.BASELINE_MODEL_KEY
    skipped = ""
    if input_dict.get(key):
        baseline = input_dict[key][0]
        # Never judged on the threshold alone because the baseline's folder moved or went: read it
        # where the root now is, or stop (storage/relocation.py).
        baseline.uri = locate(baseline.uri, candidate.uri, "model")
        baseline_info = model_info(baseline.uri)
        skipped = class_change(baseline_info.get("class_names"), names)
        tasks = [i.get("task") or "single" for i in (baseline_info, info)]
        if not skipped and tasks[0] != tasks[1]:  # one scores each class alone, the other one class of all
            skipped = f"the last blessed model is {tasks[0]}-label, this one {tasks[1]}-label"
        if skipped:
            logging.warning(
                "Evaluator: not comparing with the last blessed model: %s; blessing on the threshold alone", skipped
            )
            input_dict = {**input_dict, key: []}  # TFX then ignores change thresholds (rubber stamp)
    return input_dict, skipped


def _with_checks(exec_properties, examples, names: Optional[List[str]], multi_label: bool, compare: bool):
    """(exec_properties with each class's or label's checks, class_gate.json's content or None)."""
    gate = None
    if multi_label:  # each label judged at its own threshold (components/evaluator/multi_label.py)
        exec_properties, gate = with_label_checks(
            exec_properties,
            names,
            split_class_counts(examples, "eval"),
            split_class_counts(examples, "train"),
            compare,
            split_examples(examples, "eval"),
        )
    elif names:  # every class judged (a model that does not record its classes: accuracy alone, as before)
        exec_properties, gate = with_class_checks(
            exec_properties, names, split_class_counts(examples, "eval"), split_class_counts(examples, "train")
        )
    return exec_properties, gate


def _blessing_names_models(blessing, input_dict) -> None:
    """The blessing names the models themselves (TFX wrote the folders it scored: a head's, on the features)."""
    for key, name in (
        (standard_component_specs.MODEL_KEY, constants.ARTIFACT_PROPERTY_CURRENT_MODEL_URI_KEY),
        (standard_component_specs.BASELINE_MODEL_KEY, constants.ARTIFACT_PROPERTY_BASELINE_MODEL_URI_KEY),
    ):
        if input_dict.get(key) and blessing.has_custom_property(name):
            blessing.set_string_custom_property(name, input_dict[key][0].uri)


def _scores_as_scored(scored, evaluated_on: Dict[str, Any], load) -> Optional[on_features.RecordScores]:
    """Each eval image's class as TFMA scored it, for the look at eval images: the head on its feature record, or its
    prediction record; None where TFMA ran the serving models itself (the exported model classifies them)."""
    if evaluated_on["on"] == "features":
        return on_features.head_scores(scored, load)
    return prediction_records.prediction_scores(scored) if "predictions" in evaluated_on else None


def _test_inputs(input_dict, scored, evaluated_on: Dict[str, Any]) -> Dict[str, list]:
    """What TFMA reads to score the test split: the heads on its features, the prediction records (they hold the test
    split too), or the serving models on its raw examples."""
    if evaluated_on["on"] == "features":
        return on_features.heads(input_dict, [TEST_SPLIT])[0] or on_features.plain(input_dict)
    return scored if "predictions" in evaluated_on else on_features.plain(input_dict)


class ServingModelLoader:
    """tf.saved_model.load that keeps one SavedModel once loaded: the candidate's serving model, which the agreement
    check (on_features.choose) and the look at eval images (explanations) both run, is loaded once in an evaluation,
    not twice (~2.3 s a load with a pretrained backbone, profiled). It is held from the agreement check to the end of
    the look at eval images: one model more in memory while TFMA runs (on the heads, or, when they disagree, its own
    copy of the serving models)."""

    def __init__(self, kept_path: str):
        self.kept_path, self.kept = kept_path, None

    def __call__(self, path: str):
        if path != self.kept_path:
            return tf.saved_model.load(path)
        if self.kept is None:
            self.kept = tf.saved_model.load(path)
        return self.kept


class Executor(BeamConfigured, evaluator_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties):
        exec_properties = with_threshold(exec_properties)
        key = standard_component_specs.BASELINE_MODEL_KEY
        candidate = artifact_utils.get_single_instance(input_dict[standard_component_specs.MODEL_KEY])
        info = model_info(candidate.uri)  # read once: the classes (labels) and the task the candidate predicts
        names, multi_label = info.get("class_names"), info.get("task") == "multi" and bool(info.get("class_names"))
        input_dict, skipped = _comparable_baseline(input_dict, candidate, info, names)
        examples = artifact_utils.get_single_instance(input_dict[standard_component_specs.EXAMPLES_KEY])
        exec_properties, gate = _with_checks(exec_properties, examples, names, multi_label, bool(input_dict.get(key)))
        load = ServingModelLoader(path_utils.serving_model_path(candidate.uri))
        evaluation = artifact_utils.get_single_instance(output_dict[standard_component_specs.EVALUATION_KEY])
        # the heads on the features, where they agree with their serving models; else each serving model once
        scored, evaluated_on = on_features.choose(input_dict, ["eval"], load)
        if evaluated_on["on"] != "features":
            scored, evaluated_on = self._on_predictions(input_dict, scored, evaluated_on, evaluation, info, load)
        self._tfma(scored, output_dict, exec_properties)
        blessing = artifact_utils.get_single_instance(output_dict[standard_component_specs.BLESSING_KEY])
        _blessing_names_models(blessing, input_dict)
        if skipped:
            blessing.set_string_custom_property(BASELINE_SKIPPED, skipped)
        profile = os.path.join(examples.uri, PROFILE_FILE)
        if fileio.exists(profile):
            fileio.copy(profile, os.path.join(blessing.uri, PROFILE_FILE), overwrite=True)
        on_features.write_record(evaluation.uri, evaluated_on)
        found = (
            self._judge_labels(
                blessing, evaluation.uri, names, gate, exec_properties, held_out_thresholds(candidate.uri)
            )
            if multi_label
            else None
        )
        if gate:
            io_utils.write_string_file(os.path.join(evaluation.uri, CLASS_GATE_FILE), json.dumps(gate, indent=1))
        scores = _scores_as_scored(scored, evaluated_on, load)
        self._look_at_eval_images(candidate, examples, evaluation, exec_properties, multi_label, load, scores)
        del load  # the serving model: not held while the views are computed
        if not names:
            return  # a model that does not record its classes (older versions): no views
        if not multi_label:
            found = self._write_views(
                evaluation.uri, names, exec_properties.get(CONFIDENCE), exec_properties.get(TARGET_PRECISION)
            )
        if TEST_SPLIT in artifact_utils.decode_split_names(examples.split_names):
            self._score_test(_test_inputs(input_dict, scored, evaluated_on), evaluation.uri, exec_properties)
            chosen_how = found["chosen"]["how"]
            how = chosen_how if chosen_how == operating_point.LABEL_RULE else f"the eval split's: {chosen_how}"
            if multi_label:
                self._write_label_views(
                    os.path.join(evaluation.uri, TEST_SPLIT), names, given=found["chosen"]["thresholds"], how=how
                )
            else:
                self._write_views(
                    os.path.join(evaluation.uri, TEST_SPLIT), names, found["chosen"]["threshold"], None, how=how
                )

    def _on_predictions(self, input_dict, scored, evaluated_on, evaluation, info, load):
        """(the input_dict TFMA reads, evaluated_on.json's record) for serving models: each compared model once over
        the eval and test images into prediction records (components/evaluator/predictions.py), where it can be."""
        baseline = standard_component_specs.BASELINE_MODEL_KEY
        infos = {standard_component_specs.MODEL_KEY: info}
        if input_dict.get(baseline):
            infos[baseline] = model_info(input_dict[baseline][0].uri)
        why = prediction_records.why_not(input_dict, infos, self._beam_pipeline_args)
        if why:
            logging.info("Evaluator: TFMA runs the serving models itself: %s", why)
            return scored, {**evaluated_on, "predictions_skipped": why}
        examples = input_dict[standard_component_specs.EXAMPLES_KEY][0]
        splits = ["eval"] + [s for s in artifact_utils.decode_split_names(examples.split_names) if s == TEST_SPLIT]
        multi_label = info.get("task") == "multi"
        swapped, record = prediction_records.scored_on_predictions(
            input_dict, splits, evaluation.uri, infos, multi_label, load
        )
        return swapped, {**evaluated_on, **record}

    def _judge_labels(
        self,
        blessing,
        evaluation_uri: str,
        names: List[str],
        gate: Dict[str, Any],
        exec_properties,
        trainers: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        """A multi-label model, after TFMA: a threshold per label (views.json), and every label judged at its own
        (into `gate`: a failure takes the blessing back). Returns the views. The thresholds are the ones the Trainer
        chose on its held-out train images (`trainers`), unless the run asks for a confidence threshold or a target
        precision; a model trained before them gets them chosen here, on eval."""
        confidence, target = exec_properties.get(CONFIDENCE), exec_properties.get(TARGET_PRECISION)
        given = trainers if trainers and confidence is None and target is None else None
        found = self._write_label_views(
            evaluation_uri,
            names,
            confidence_threshold=confidence,
            target_precision=target,
            **({"given": given["thresholds"], "how": given["rule"]} if given else {}),
        )
        gate["failures"] = multi_label_evaluation.label_failures(gate, found)
        if gate["failures"] and blessing.get_int_custom_property("blessed"):
            logging.warning("Evaluator: not blessed: %s", "; ".join(gate["failures"]))
            multi_label_evaluation.take_back_blessing(blessing, gate["failures"])
        return found

    @staticmethod
    def _write_label_views(folder: str, names: List[str], **how) -> Dict[str, Any]:
        """views.json of a multi-label evaluation (components/evaluator/multi_label.py views), from TFMA's metrics."""
        found = multi_label_evaluation.views(multi_label_evaluation.read_metrics(folder), names, **how)
        io_utils.write_string_file(os.path.join(folder, evaluation_views.VIEWS_FILE), json.dumps(found, indent=1))
        return found

    @staticmethod
    def _look_at_eval_images(candidate, examples, evaluation, exec_properties, multi_label: bool, load, scores) -> None:
        """The first misclassified eval images (components/evaluator/misclassified.py) and where the model looked on a
        sample of them (components/evaluator/explanations.py), for the report, in one pass over the eval images: each
        image's class is what TFMA scored (`scores`: on_features.RecordScores; None: the exported model classifies
        them), the exported model explains. A pass that fails is logged and left out: it blesses nothing."""
        limit = exec_properties.get(EXPLANATIONS)
        limit = eval_explanations.LIMIT if limit is None else int(limit)
        try:
            found = eval_explanations.explain_eval(
                path_utils.serving_model_path(candidate.uri),
                examples.uri,
                evaluation.uri,
                limit,
                multi_label,
                load,
                scores,
            )
            listed, explained = found["misclassified"], found["explanations"]
            logging.info(
                "Evaluator: %d of the first %d eval images misclassified; %d explained",
                len(listed["images"]),
                listed["examined"],
                len(explained.get("images", [])),
            )
        except Exception as e:  # noqa: BLE001 - the report says there are none; the evaluation stands
            logging.warning(
                "Evaluator: no misclassified images or explanations (%s: %s)",
                type(e).__name__,
                (str(e).splitlines() or [""])[0][:200],
            )

    @staticmethod
    def _write_views(
        uri: str, names: List[str], confidence: Optional[float], target: Optional[float], how: Optional[str] = None
    ) -> dict:
        found = evaluation_views.views(evaluation_results.matrices(uri), names, confidence, target)
        if how:
            found["chosen"]["how"] = how
        io_utils.write_string_file(os.path.join(uri, evaluation_views.VIEWS_FILE), json.dumps(found, indent=1))
        return found

    def _score_test(self, input_dict, evaluation_uri: str, exec_properties) -> None:
        """TFX's Evaluator once more, on the test split alone, into <evaluation>/test (blessing nothing)."""
        scored = standard_artifacts.ModelEvaluation()
        scored.uri = os.path.join(evaluation_uri, TEST_SPLIT)
        unused = standard_artifacts.ModelBlessing()
        inputs = {k: v for k, v in input_dict.items() if k != standard_component_specs.BASELINE_MODEL_KEY}
        properties = {**exec_properties, standard_component_specs.EXAMPLE_SPLITS_KEY: json.dumps([TEST_SPLIT])}
        logging.info("Evaluator: scoring the test split apart, into %s", scored.uri)
        with tempfile.TemporaryDirectory(prefix="imagepipe-test-blessing-") as unused.uri:
            self._tfma(
                inputs,
                {standard_component_specs.EVALUATION_KEY: [scored], standard_component_specs.BLESSING_KEY: [unused]},
                properties,
            )

    def _tfma(self, input_dict, output_dict, exec_properties) -> None:
        """TFX's executor (TFMA), its batches bounded by count too (each batch is decoded whole) and the serialized
        examples it hands the model not printed whole (components/beam_settings.py)."""
        with smaller_batches(), bytes_printed_as_sizes():
            super().Do(input_dict, output_dict, exec_properties)
