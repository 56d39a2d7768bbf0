"""Costs Beam pays again and again for every transform of a graph, cut without changing what Beam computes; for
any executor that builds a Beam graph.

- Pickling resets every logger. Beam wraps each pickle and unpickle (every DoFn, coder and transform: about
  7,000 in a run of the pipeline on 300 images) in dill's `_trace(False)`, which calls `logger.setLevel`;
  logging then clears the level cache of every logger in the process, thousands once TensorFlow and TFX are
  loaded: ~0.4 ms a call, 3.3 s of a 27 s run (profiled). The level it sets is the one the logger already has,
  so only a change is passed on.
- The same signatures, again and again. Beam asks for the state and timer parameters of every DoFn
  (`userstate.get_dofn_specs`) about nine times over a graph's life (building, its proto, the runner, the
  worker's copy), and each time runs `inspect.signature` on every method of the DoFn: ~140,000 calls, 3.6 s of a
  25 s run on 300 images (profiled; 1.75 s with the cut: Beam's walk over the methods stays). A plain function's
  signature is made of its code and defaults, which nothing here changes after it is defined: each is computed
  once and kept while the function lives (weakly), and a function with `__signature__`, `__wrapped__` or a
  partialmethod's mark (whose signature lives elsewhere) is always asked anew.
- An argument parser built for every view. `PipelineOptions.view_as` builds the view's whole argument parser
  and parses the flags again, twice for every transform applied (`Pipeline.apply` asks for its type options):
  ~0.9 s of a small run (profiled). A view shares everything it holds with its options but the parsed flags, so
  each options object keeps its view of each class while its flags stay the same (the same list, the same
  contents), its values are the same dict and still hold the view's names, and the class is made by Beam's own
  `__init__`.
- Every loaded module listed for every value weighed. Beam's state cache (side inputs, each bundle's state) weighs
  each value it keeps with objsize, which first lists the globals of every loaded module to leave them out:
  3-6 ms a value once TensorFlow and TFX are loaded (~9,500 modules), ~100 values in a small run, 0.6-0.8 s of its
  ~20 s (timed). The list is made again only when the loaded modules change; each weight is objsize's own.

- A DoFn pickled again to add its windowing. Building each ParDo of a bundle, Beam's worker unpickles the DoFn's
  data the runner sent, pickles it again (dill, then bz2 at level 9) with the windowing it looked up put in, and the
  operation then unpickles that twice: ~1.5 ms a ParDo, ~475 ParDos and 0.7-0.8 s of a small run's ~14 s (timed).
  The worker's pickler now hands the operation the data as sent with the windowing beside it (`_Rewindowed`, which
  never leaves the process), and each unpickling of it gives what the pickled copy would: the DoFn's data unpickled
  anew, the windowing put in.

Not cut: Beam's walk over every method of a DoFn (`userstate.get_dofn_specs`, ~0.7 s of a small run). What it finds
can depend on the instance (a DoFn's `_inspect_process` hook: Beam's runtime type-check wrappers answer for the DoFn
they wrap), so it cannot be kept by class. Nor the bz2 compression of each DoFn the graph pickles for its runner
(its level does not matter at these sizes): another format would be read by processes without this module (Beam's
multi_processing workers, Dataflow).

Light on purpose: ImageExampleGen's container imports it without TFX's other executors.
"""

import logging
import sys
import threading
import types
import weakref

from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import bundle_processor, statecache
from apache_beam.typehints import decorators
from dill import _dill
from objsize import traverse

# What inspect.signature reads from a function besides its code and defaults: such a function is always asked anew.
ASKED_ANEW = frozenset({"__signature__", "__wrapped__", "_partialmethod", "__partialmethod__"})


def cut_overheads() -> None:
    """Every cut, in this process (each made once)."""
    _quiet_pickler_trace()
    _remember_signatures()
    _remember_views()
    _list_modules_once()
    _rewindow_without_pickling()


def _quiet_pickler_trace() -> None:
    """dill's _trace(on) sets its logger's level only when that changes it."""
    if getattr(_dill._trace, "only_changes", False):  # pylint: disable=protected-access
        return
    original = _dill._trace  # pylint: disable=protected-access

    def trace(boolean):
        if _dill.log.level != (logging.INFO if boolean else logging.WARN):
            original(boolean)

    trace.only_changes = True
    _dill._trace = trace  # pylint: disable=protected-access


def _remember_signatures() -> None:
    """Beam's get_signature, remembered for plain functions and the methods bound to them."""
    original = getattr(decorators, "get_signature", None)
    if original is None or getattr(original, "remembered", False):  # a Beam without it, or done already
        return
    known = weakref.WeakKeyDictionary()  # function -> its signature
    bound = weakref.WeakKeyDictionary()  # function -> its signature as a bound method (the first parameter gone)

    def get_signature(func):
        kept, function = (bound, func.__func__) if isinstance(func, types.MethodType) else (known, func)
        if type(function) is not types.FunctionType or ASKED_ANEW & function.__dict__.keys():
            return original(func)
        signature = kept.get(function)
        if signature is None:
            signature = kept[function] = original(func)
        return signature

    get_signature.remembered = True
    get_signature.original = original
    for module in beam_modules_holding(original):  # Beam's modules import the function by name
        module.get_signature = get_signature


def beam_modules_holding(function) -> list:
    """Beam's loaded modules whose `get_signature` is `function`."""
    return [
        module
        for module in list(sys.modules.values())
        if getattr(module, "__name__", "").startswith("apache_beam")
        and getattr(module, "get_signature", None) is function
    ]


def _remember_views() -> None:
    """PipelineOptions.view_as, remembered for each options object, view class and flags."""
    original = PipelineOptions.view_as
    if getattr(original, "remembered", False):
        return
    kept = weakref.WeakKeyDictionary()  # options -> {(view class, flags): (view, its option names)}

    def view_as(self, cls):
        flags = self._flags
        key = (cls, tuple(sys.argv) if flags is None else tuple(flags))  # no flags: Beam parses the command line
        views = kept.get(self)
        if views is None:  # setdefault would make a weak reference on every call
            views = kept[self] = {}
        try:
            view, names = views.get(key, (None, None))
        except TypeError:  # flags that cannot be hashed
            return original(self, cls)
        # A view holds its options' values and flags: one made before either was replaced, or the values emptied,
        # is made again; a class with an __init__ of its own is made anew every time, as Beam does.
        if (
            view is None
            or view._all_options is not self._all_options
            or view._flags is not flags
            or not names <= self._all_options.keys()
        ):
            view = original(self, cls)
            if cls.__init__ is PipelineOptions.__init__:
                views[key] = view, frozenset(view._visible_option_list())
        return view

    view_as.remembered = True
    view_as.original = original
    PipelineOptions.view_as = view_as


class _ModulesListedOnce(traverse.TraversalContext):
    """objsize's traversal, the loaded modules' globals left out from a list made once per set of loaded modules."""

    _listed = ((), frozenset())  # (which modules: their count and the last loaded, the ids of their globals)

    def _update_exclude_set(self):
        loaded = (len(sys.modules), next(reversed(sys.modules), None))
        if _ModulesListedOnce._listed[0] != loaded:
            _ModulesListedOnce._listed = loaded, frozenset(map(id, traverse._iter_modules_globals()))  # pylint: disable=protected-access
        self.exclude_set.update(_ModulesListedOnce._listed[1])
        super()._update_exclude_set()  # None, and what the settings exclude (not the modules: exclude_modules_globals)


def _list_modules_once() -> None:
    """Beam's state cache weighs its values with the loaded modules' globals listed once, not for every value."""
    original = statecache.get_deep_size
    if getattr(original, "listed_once", False):
        return
    settings = traverse.ObjSizeSettings(
        # pylint: disable=protected-access - Beam's own functions: the weight it would give
        get_referents_func=statecache._get_referents_func,
        filter_func=statecache._filter_func,
        get_size_func=statecache._size_func,
        exclude_modules_globals=False,  # _ModulesListedOnce adds them
    )

    def get_deep_size(*objs):
        return _ModulesListedOnce(settings).get_deep_size(*objs)

    get_deep_size.listed_once = True
    get_deep_size.original = original
    statecache.get_deep_size = get_deep_size  # the cache calls it through its module


class _Rewindowed(bytes):
    """A DoFn's pickled data as the runner sent it (no windowing in it), with the windowing Beam's worker found for
    it beside: what the worker would have pickled again. Made and read in this process only."""

    def __new__(cls, sent: bytes, windowing):
        made = super().__new__(cls, sent)
        made.windowing = windowing
        return made


class _WorkerPickler:
    """bundle_processor's pickler: the DoFn data it unpickled, given back with only the windowing put in where the
    last value is, comes back as a _Rewindowed of the bytes it was read from, not pickled again. Anything else is
    Beam's pickler's."""

    def __init__(self):
        self._read = threading.local()  # a thread's last unpickled (bytes, value): bundles are built on many threads

    def __getattr__(self, name):
        return getattr(pickler, name)

    def loads(self, encoded, *args, **kwargs):
        value = pickler.loads(encoded, *args, **kwargs)
        self._read.last = (encoded, value) if type(value) is tuple and value and value[-1] is None else None
        return value

    def dumps(self, value, *args, **kwargs):
        last, self._read.last = getattr(self._read, "last", None), None
        if last is not None and not args and not kwargs and type(value) is tuple:
            encoded, read = last
            if len(value) == len(read) and all(new is old for new, old in zip(value[:-1], read[:-1])):
                return _Rewindowed(encoded, value[-1])
        return pickler.dumps(value, *args, **kwargs)


def _rewindow_without_pickling() -> None:
    """Beam's worker builds each ParDo without pickling its DoFn again (_WorkerPickler); pickler.loads reads what it
    gives as the pickled copy would read."""
    original = pickler.loads
    if getattr(original, "rewindowed", False):
        return

    def loads(encoded, *args, **kwargs):
        if type(encoded) is _Rewindowed:
            return original(bytes(encoded), *args, **kwargs)[:-1] + (encoded.windowing,)
        return original(encoded, *args, **kwargs)

    loads.rewindowed = True
    loads.original = original
    pickler.loads = loads  # Beam's operations call it through the module
    bundle_processor.pickler = _WorkerPickler()
