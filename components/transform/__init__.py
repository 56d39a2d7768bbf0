"""Transform: preprocessing.py's preprocessing_fn (decode and resize: images/decoding.py; label ids) and
executor.py (TFX's executor, its records stored undeflated)."""
