"""The Evaluator's summary, read back for the run summary and the report: TFMA's figures (results.py), the blessing,
the explanations' index, the misclassified images."""

from typing import Any, Dict

from components.evaluator import explanations, misclassified, results
from components.summary_reading import first


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    evaluation = first(c["outputs"], "evaluation")
    if not evaluation:
        return {}
    blessing = (c["output_properties"].get("blessing") or [{}])[0]
    return {
        **results.metrics(evaluation),
        "confusion": results.confusion_matrix(evaluation),
        "views": results.views(evaluation),
        "test": results.test_split(evaluation),
        "evaluated_on": results.evaluated_on(evaluation),  # the heads on the features, or the serving models
        # where the model looked on a sample of eval images (explanations.py)
        "explanations": explanations.read_index(evaluation),
        # the first misclassified eval images (misclassified.py)
        "misclassified": misclassified.read(evaluation),
        "blessed": bool(blessing.get("blessed")),
        # Set by executor.py when the last blessed model predicts other classes.
        "baseline_skipped": blessing.get("baseline_skipped", ""),
    }
