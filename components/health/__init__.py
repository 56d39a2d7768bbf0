"""DataHealth: likely label errors, outliers and drift in feature space, found before training.

component.py      the TFX component (after Transform and the features step, before the Trainer)
executor.py       reads the examples (and features), runs the checks, writes the report
gate.py           DataHealthGate: stops the run on the checks over their limits (or warns)
label_issues.py   out-of-sample probabilities (k-fold) ranked with confident learning (cleanlab)
checks.py         poor images, feature-space outliers, feature drift, the thresholds (plain Python)

Near-duplicates are found at ingestion (components/example_gen/near_duplicates.py); this
component reads ImageExampleGen's summary for their share of eval and gates on it with the rest.

Files of the `health` output, read by the run summary and the report without TFX:
"""

HEALTH_FILE = "health.json"  # counts, checks against their thresholds, the first suspects
LABEL_ISSUES_FILE = "label_issues.csv"  # every suspected label error, most likely first
OUTLIERS_FILE = "outliers.csv"  # poor images and feature-space outliers, with reasons

LABEL_CHECKS = ("auto", "on", "off")  # auto: with the transfer models' features, where the check is cheap
# Below this out-of-sample accuracy of the label check's model, its ranking is weak (summary and report say
# so, and --max-label-issues does not act on it): on the shapes set (bench/shapes.py), where the check's
# cnn reaches 0.18, it found 14 of 95 flips among the first 190 suspects.
TRUSTED_ACCURACY = 0.8
