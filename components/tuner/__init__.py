"""The Tuner step: TFX's Tuner (KerasTuner, trainer/search.py) that searches only when it is worth it.

component.py   ImageTuner: TFX's Tuner spec, with the last search's best values as an input and the trials a
               parameter a compiled job can change
executor.py    decides, then searches here (TFX's Tuner executor) or as a Vertex AI Training job (TFX's Vertex
               Tuner extension, parallel trials), or hands on the last search's values
decision.py    when to search again (plain Python)

Files, read by the run summary and the report without TFX:
"""

# In tuner_results, beside TFX's tuner_results.json (best_hyperparameters holds TFX's one file, as its Trainer
# requires): the search that found the values (its trials, the data and settings it searched on, TFX's best
# config), so a later run can decide to reuse them, and say whose they are; and what this run did
# (searched or reused, and why).
SEARCH_FILE = "search.json"
DECISION_FILE = "tuning.json"
MODES = ("search", "auto")  # search: always (--tune N locally, --retune); auto: when decision.py says so
