"""One declaration per setting. A setting a user gives is a dataclass field made by `setting()`, with its default
and its help, where its meaning lives (trainer/hparams.py: the training settings; components/health/__init__.py:
data health's limits). pipeline/config.py makes PipelineConfig's field (and so its IMAGEPIPE_<NAME> variable) and
cli/parser.py its `imagepipe run` option from the declaration. The bottom layer: it imports nothing of the project.
"""

import dataclasses
from typing import Optional, Tuple


def setting(default, help: str, choices: Optional[Tuple[str, ...]] = None, flag: str = ""):
    """A setting's declaration: its default, its help (`{default}` in it is the default), its choices, and `flag`
    when its `imagepipe run` option is not --<name>."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "flag": flag})
