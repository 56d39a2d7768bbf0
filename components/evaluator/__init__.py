"""The Evaluator: TFMA's, made class-aware.

component.py     ImageEvaluator: TFX's Evaluator with its settings as runtime parameters
eval_config.py   its parameters' names and the single-label TFMA configuration
executor.py      no comparison across class changes, every class judged, views.json, the test split
metrics.py       per-class recall and precision and balanced accuracy as TFMA metrics; the class gate's specs
multi_label.py   a multi-label model's configuration, per-label thresholds and gate
views.py         precision, recall and coverage at confidence thresholds (plain Python)
explanations.py  where the model looked, on a sample of eval images, for the report
results.py       what the Evaluator found, read back from its artifact (the summary, the card, the report)
"""
