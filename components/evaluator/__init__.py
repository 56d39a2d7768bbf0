"""The Evaluator: TFMA's, made class-aware.

component.py     ImageEvaluator: TFX's Evaluator with its settings as runtime parameters
eval_config.py   its parameters' names and the single-label TFMA configuration
sparse_metrics.py  accuracy and cross-entropy as TFMA computes them: Keras's figures, in numpy
on_features.py   TFMA on the features step's features: the models' heads, where the serving model agrees
predictions.py   else each serving model once over the eval images into prediction records, which TFMA scores
executor.py      no comparison across class changes, every class judged, views.json, the test split
metrics.py       per-class recall and precision and balanced accuracy as TFMA metrics; the class gate's specs
multi_label.py   a multi-label model's configuration, per-label thresholds and gate
views.py         precision, recall and coverage at confidence thresholds (plain Python)
explanations.py  where the model looked, on a sample of eval images, for the report
misclassified.py  the first misclassified eval images, found in the explanations' pass, for the report and review
results.py       what the Evaluator found, read back from its artifact (the summary, the card, the report)
"""

import dataclasses
from typing import Optional

from settings import fraction, setting
from trainer.class_balance import ACCURACY_THRESHOLD, MIN_CLASS_RECALL, MIN_EVAL_EXAMPLES

_THRESHOLD = (lambda v: 0 <= v < 1, "use a fraction from 0 to below 1")


@dataclasses.dataclass(frozen=True)
class Blessing:
    """What blesses a model (after the first, also no worse than the last blessed one), and the confidence threshold
    that goes with it. The Pusher copies blessed models under <root>/serving/<name>."""

    accuracy_threshold: float = setting(
        ACCURACY_THRESHOLD, "bless the model at this eval accuracy (default {default})", check=fraction(), runtime=True
    )
    # Every class with at least MIN_EVAL_EXAMPLES eval images must reach it: a model that misses a class is never
    # blessed, whatever its accuracy.
    min_class_recall: float = setting(
        MIN_CLASS_RECALL,
        f"and only when every class with at least {MIN_EVAL_EXAMPLES} eval images reaches this recall "
        "(default {default}; 0: no check)",
        check=fraction("0: no check"),
        runtime=True,
    )
    # imagepipe predict answers "unsure" at or below it: this one, or the lowest at which the eval split's
    # precision reaches target_precision; none by default.
    confidence_threshold: Optional[float] = setting(
        None,
        "the model answers 'unsure' at or below this top probability (imagepipe predict; in the model card): the "
        "report shows precision, recall and coverage at every threshold",
        check=_THRESHOLD,
    )
    target_precision: Optional[float] = setting(
        None,
        "instead: the lowest confidence threshold at which the eval split's precision reaches this",
        check=_THRESHOLD,
    )
    # Eval images the Evaluator explains for the report (where the model looked: explanations.py). 12: half of them
    # misclassified, then each class in turn; each costs trainer/explain.STEPS forward and backward passes (~0.37 s
    # with EfficientNet-Lite0 at 224 px on 2 cores, plus ~4.5 s once): 8.6-8.9 s on a 2,000-image run, within the 10 s
    # asked of them (16: 10.2-11.2 s; docs/benchmarks.md, Explanations).
    explanations: int = setting(
        12,
        "show where the model looked on N eval images in the report: the misclassified first, then some of each "
        "class, and each class's average map (integrated gradients; default {default}; 0: none)",
        check=(lambda v: v >= 0, "give a number of eval images (0: none)"),
        metavar="N",
    )
