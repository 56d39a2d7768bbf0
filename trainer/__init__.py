"""The model code: what TFX's Trainer runs (run_fn in task.py), and the Tuner's search (search.py), the
features step, the Evaluator's explanations and `imagepipe predict` share (the TFX templates' models/).
It imports no stage: components/ imports it."""
