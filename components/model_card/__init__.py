"""ModelCard: a model card with every model, written from ML Metadata and the artifacts, pushed with the model.

component.py   the TFX component (after the Evaluator; the Pusher copies its files next to the model)
executor.py    reads the run's artifacts into the card (nothing is copied by hand)
render.py      the card as Markdown and as HTML

Files of the `model_card` output (and of every pushed model folder):
"""

CARD_JSON = "model_card.json"
CARD_MD = "model_card.md"
CARD_HTML = "model_card.html"
# The confidence threshold that goes with the model: `imagepipe predict` answers "unsure" at or below it.
THRESHOLD_FILE = "threshold.json"
FILES = (CARD_JSON, CARD_MD, CARD_HTML, THRESHOLD_FILE)
SCHEMA_VERSION = 2
# What a person must write: marked as such in every format, never filled in by the pipeline.
TO_FILL_IN = "TO FILL IN"

# model_card.json, version 2 (every key is always present; a value the run does not have is null):
#
#   schema_version      2 (2 added the class mix and every class's figures: data.imbalance_ratio,
#                       data.classes_with_few_eval_examples, training.class_balance, evaluation.balanced_accuracy,
#                       evaluation.weakest_class, evaluation.class_gate, last_blessed.balanced_accuracy)
#   model               name (the pipeline), architecture (cnn | efficientnet_lite0 | mobilenet_v2 | efficientnet_b0),
#                       architecture_detail (its weights, and why --model auto chose it), image_size,
#                       classes [names, in id order], created (UTC), framework {stack, python, tensorflow, tfx, keras},
#                       artifact (the Trainer's model URI), signature (serving_default input and outputs)
#   data                sources [the ingested folder or file], layout, span, files_seen, examples,
#                       per_split {split: n}, per_class_and_split {split: {class: n}}, imbalance_ratio
#                       (largest / smallest class in train), classes_with_few_eval_examples [names], quarantined,
#                       quarantine_reasons {reason: n}, duplicate_files, near_duplicate_groups,
#                       eval_with_near_duplicate_in_train (share), likely_label_errors (n or null)
#   training            settings {the Trainer's hyperparameters}, tuned {values the search chose, or null},
#                       epochs (trained), kept_epoch, device, seconds, warm_started_from, class_balance
#                       {mode (weights | sampling | off), imbalance_ratio, monitor (the metric the kept epoch followed)},
#                       lineage {pipeline, run, span, base_model {artifact, id} or null}
#   evaluation          split (eval), examples, accuracy, balanced_accuracy, weakest_class {name, recall, support,
#                       judged}, per_class {class: {precision, recall, f1, support}} at the threshold,
#                       confidence_threshold {threshold, how}, at_threshold {precision, recall, coverage},
#                       class_gate {min_class_recall, min_eval_examples, judged [names held to the floor],
#                       must_find [names with a few eval images, one of which must be found], compared_on}, blessed,
#                       blessing_reason, last_blessed {accuracy, balanced_accuracy, artifact} or null,
#                       test {examples, accuracy, balanced_accuracy, weakest_class, per_class, at_threshold} or null
#   exports             [{name, file, format, bytes, input, agreement | error}]: the SavedModel, then the TFLite models
#                       (--tflite) and ONNX and Core ML (--exports), each with how it agrees with the SavedModel
#   to_fill_in          intended_use, limitations, ethical_considerations, contact: "TO FILL IN: ..."
