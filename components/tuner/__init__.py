"""The Tuner step: TFX's Tuner (KerasTuner, trainer/search.py) that searches only when it is worth it.

component.py   ImageTuner: TFX's Tuner spec, with the last search's best values as an input and the trials a
               parameter a compiled job can change
executor.py    decides, then searches here (TFX's Tuner executor) or as a Vertex AI Training job (TFX's Vertex
               Tuner extension, parallel trials), or hands on the last search's values
decision.py    when to search again (plain Python)

Files, read by the run summary and the report without TFX:
"""

import dataclasses

from settings import setting

# In tuner_results, beside TFX's tuner_results.json (best_hyperparameters holds TFX's one file, as its Trainer
# requires): the search that found the values (its trials, the data and settings it searched on, TFX's best
# config), so a later run can decide to reuse them, and say whose they are; and what this run did
# (searched or reused, and why).
SEARCH_FILE = "search.json"
DECISION_FILE = "tuning.json"
MODES = ("search", "auto")  # search: always (--tune N locally, --retune); auto: when decision.py says so

MAX_TRIALS = 1000


@dataclasses.dataclass(frozen=True)
class Search:
    """The hyperparameter search (trainer/search.py). tune_mode "search": this run searches (`imagepipe run --tune
    N`, --retune); "auto": only when the data or settings moved since the last search, else its best values are
    reused (compiled jobs; local runs of a pipeline that searched before)."""

    # Trials per search; 0: no search step. One name everywhere: the option is --tune N.
    tune_trials: int = setting(
        0,
        "search hyperparameters first (learning rate, dropout, head width, batch size; KerasTuner, Bayesian) in N "
        "trials scored on held-out train images; later runs of the pipeline reuse the best values until the classes, the "
        "data or the settings change (default {default}: no search)",
        flag="--tune",
        check=(lambda v: 0 <= v <= MAX_TRIALS, f"use a number of trials from 1 to {MAX_TRIALS:,} (0: no search)"),
        runtime="tune_trials",
        metavar="N",
    )
    tune_mode: str = setting("auto", "search or auto; default {default} (--retune sets it to search)", MODES, flag=None)
