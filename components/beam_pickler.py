"""Beam's pickling without resetting every logger of the process, for any executor that builds a Beam graph.

Beam wraps each pickle and unpickle (every DoFn, coder and transform of a graph: about 7,000 in a run
of the pipeline on 300 images) in dill's `_trace(False)`, which calls `logger.setLevel`; logging then
clears the level cache of every logger in the process, thousands once TensorFlow and TFX are loaded:
~0.4 ms a call, 3.3 s of a 27 s run (profiled). The level it sets is the one the logger already has, so
passing on only a change keeps what dill does and drops the cost. Light on purpose: ImageExampleGen's
container imports it without TFX's other executors.
"""

import logging

from dill import _dill


def quiet_pickler_trace() -> None:
    """dill's _trace(on) sets its logger's level only when that changes it."""
    if getattr(_dill._trace, "only_changes", False):  # pylint: disable=protected-access
        return
    original = _dill._trace  # pylint: disable=protected-access

    def trace(boolean):
        if _dill.log.level != (logging.INFO if boolean else logging.WARN):
            original(boolean)

    trace.only_changes = True
    _dill._trace = trace  # pylint: disable=protected-access
