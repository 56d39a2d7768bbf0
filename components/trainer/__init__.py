"""The Trainer: component.py (ImageTrainer: TFX's Trainer with runtime parameters, locally or on Vertex AI
Training). What it runs, run_fn and the model, is trainer/ at the project's top."""
