"""DataHealth: likely label errors, outliers and drift in feature space, found before training.

component.py      the TFX component (after Transform and the features step, before the Trainer)
executor.py       reads the examples (and features), runs the checks, writes the report
gate.py           DataHealthGate: stops the run on the checks over their limits (or warns)
label_issues.py   out-of-sample probabilities (k-fold) ranked with confident learning (cleanlab)
checks.py         poor images, feature-space outliers, feature drift, the thresholds (plain Python)

Near-duplicates are found at ingestion (images/near_duplicates/grouping.py); this
component reads ImageExampleGen's summary for their share of eval and gates on it with the rest.

Files of the `health` output, read by the run summary and the report without TFX:
"""

import dataclasses

from settings import fraction, setting

HEALTH_FILE = "health.json"  # counts, checks against their thresholds, the first suspects
LABEL_ISSUES_FILE = "label_issues.csv"  # every suspected label error, most likely first
OUTLIERS_FILE = "outliers.csv"  # poor images and feature-space outliers, with reasons

LABEL_CHECKS = ("auto", "on", "off")  # auto: with the transfer models' features, where the check is cheap
# Below this out-of-sample accuracy of the label check's model, its ranking is weak (summary and report say
# so, and --max-label-issues does not act on it): on the shapes set (bench/shapes.py), where the check's
# cnn reaches 0.18, it found 14 of 95 flips among the first 190 suspects.
TRUSTED_ACCURACY = 0.8


@dataclasses.dataclass(frozen=True)
class LabelCheck:
    """Whether data health looks for likely label errors: auto (on for the transfer models, whose backbone features
    make it cheap), on (also a k-fold cnn on pixels), off."""

    label_check: str = setting(
        "auto",
        "look for likely label errors: auto (with the transfer models' features), on (also a k-fold cnn on "
        "pixels, ~one more training), off; default {default}",
        LABEL_CHECKS,
    )


@dataclasses.dataclass(frozen=True)
class Limits:
    """What stops the run like the validation gate (or warns, --gate warn): each limit declared once, here.
    PipelineConfig's field, its IMAGEPIPE_<NAME> variable, the `imagepipe run --<name>` option and DataHealth's
    parameter are made from these declarations; checks.problems() says what each finding is."""

    max_eval_near_duplicates: float = setting(
        1.0,
        "largest share of eval examples with a near-duplicate in train (default {default}: no check)",
        check=fraction("1: no check"),
    )
    max_label_issues: float = setting(
        1.0, "largest share of suspected label errors (default {default}: no check)", check=fraction("1: no check")
    )
    max_feature_drift: float = setting(
        0.5,
        "largest shift of the backbone features from the last blessed model's data (default {default})",
        check=(lambda v: 0 <= v, "use 0 or more (a standardised shift)"),
    )
