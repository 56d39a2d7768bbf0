"""Beam's per-transform costs cut (components/beam_overheads.py): the same signatures, options, weights and results,
each plain function's signature and each options view made once, the loaded modules listed once for the weights,
no DoFn pickled again by the worker to add its windowing."""

import contextlib
import functools
import inspect
import json
import sys
import types
from unittest import mock

import apache_beam as beam
import numpy as np
from apache_beam.internal import pickler
from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import DebugOptions, PipelineOptions, StandardOptions, TypeOptions
from apache_beam.runners.worker import bundle_processor, statecache
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core, userstate, window
from apache_beam.transforms.userstate import BagStateSpec
from apache_beam.typehints import decorators
from objsize import traverse

from components.beam_overheads import beam_modules_holding, cut_overheads

ORIGINAL = getattr(decorators.get_signature, "original", decorators.get_signature)  # as Beam defines it
BEAM_VIEW = getattr(PipelineOptions.view_as, "original", PipelineOptions.view_as)
BEAM_WEIGHT = getattr(statecache.get_deep_size, "original", statecache.get_deep_size)


class _Stateful(beam.DoFn):
    SEEN = BagStateSpec("seen", beam.coders.StrUtf8Coder())

    def process(self, element, seen=beam.DoFn.StateParam(SEEN)):  # noqa: B008 - how Beam declares state
        key, value = element
        seen.add(value)
        yield key, sorted(seen.read())


def _plain(a, b=2, *rest, key=None):
    return a


class _Partly:
    fixed = functools.partialmethod(lambda self, a, b: a, 1)


def test_every_callable_gets_the_signature_beam_gives_it():
    cut_overheads()
    assert decorators.get_signature is not ORIGINAL and core.get_signature is decorators.get_signature
    stateful = _Stateful()
    callables = [
        _plain,
        lambda x, y=1: x,
        stateful.process,
        stateful.setup,
        functools.partial(_plain, 1),
        _Partly.fixed,  # a partialmethod, through its class and bound
        _Partly().fixed,
        str.strip,  # a method descriptor: Beam hints its first argument
        int,  # a type: Beam hints its return
        len,
    ]
    for f in callables:
        assert decorators.get_signature(f) == ORIGINAL(f), f
        assert decorators.get_signature(f) == ORIGINAL(f), f  # the second time, from what was kept
    assert userstate.get_dofn_specs(stateful) == ({_Stateful.SEEN}, set())


def test_a_function_given_its_signature_later_is_asked_anew():
    cut_overheads()

    def later(a, b):
        return a

    assert list(decorators.get_signature(later).parameters) == ["a", "b"]
    later.__signature__ = inspect.Signature([inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    assert list(decorators.get_signature(later).parameters) == ["c"]

    @functools.wraps(_plain)
    def wrapper(*args, **kwargs):
        return _plain(*args, **kwargs)

    assert decorators.get_signature(wrapper) == ORIGINAL(wrapper) == inspect.signature(_plain)


def _values(view) -> dict:
    return {name: getattr(view, name) for name in view._visible_option_list()}  # pylint: disable=protected-access


def test_an_options_view_is_made_once_and_shows_every_change():
    cut_overheads()
    flags = ["--runner=DirectRunner", "--experiments=a", "--direct_num_workers=2"]
    options = PipelineOptions(flags)
    assert options.view_as(TypeOptions) is options.view_as(TypeOptions)
    for cls in (StandardOptions, DebugOptions, TypeOptions, pipeline_options.DirectOptions):
        assert _values(options.view_as(cls)) == _values(BEAM_VIEW(PipelineOptions(flags), cls)), cls
    options.view_as(StandardOptions).runner = "FnApiRunner"  # set through one view: seen through every other
    assert options.view_as(StandardOptions).runner == BEAM_VIEW(options, StandardOptions).runner == "FnApiRunner"
    options.view_as(DebugOptions).experiments.append("b")  # a list of one options object is its own
    assert options.view_as(DebugOptions).experiments == ["a", "b"]
    assert PipelineOptions(flags).view_as(DebugOptions).experiments == ["a"]
    assert PipelineOptions(["--experiments=c"]).view_as(DebugOptions).experiments == ["c"]
    view = options.view_as(StandardOptions)
    options._all_options = dict(options._all_options)  # pylint: disable=protected-access  # values replaced
    assert options.view_as(StandardOptions) is not view
    assert _values(options.view_as(StandardOptions)) == _values(BEAM_VIEW(options, StandardOptions))
    options._flags = list(flags)  # pylint: disable=protected-access  # equal flags, another list
    assert options.view_as(StandardOptions)._flags is options._flags  # pylint: disable=protected-access


def _graph_calls() -> dict:
    """Calls made while a small graph (a lambda, a stateful DoFn, a combiner) is built and run: signatures asked,
    options parsers built."""
    with contextlib.ExitStack() as stack:
        calls = {
            "signatures": stack.enter_context(mock.patch.object(inspect, "signature", wraps=inspect.signature)),
            "parsers": stack.enter_context(
                mock.patch.object(TypeOptions, "_add_argparse_args", wraps=TypeOptions._add_argparse_args)
            ),
        }
        with beam.Pipeline() as p:
            pairs = p | beam.Create([("a", "1"), ("a", "2"), ("b", "3")]) | beam.Map(lambda kv: (kv[0], kv[1]))
            assert_that(pairs | beam.ParDo(_Stateful()) | beam.combiners.Count.Globally(), equal_to([3]))
    return {name: call.call_count for name, call in calls.items()}


@contextlib.contextmanager
def _beam_as_it_is():
    """Beam's own functions, in every module of Beam's that holds them, for the block."""
    with contextlib.ExitStack() as stack:
        for module in beam_modules_holding(decorators.get_signature):
            stack.enter_context(mock.patch.object(module, "get_signature", ORIGINAL))
        stack.enter_context(mock.patch.object(PipelineOptions, "view_as", BEAM_VIEW))
        yield


def test_a_graph_runs_the_same_and_asks_for_each_signature_and_view_once():
    cut_overheads()
    with _beam_as_it_is():
        before = _graph_calls()
    _graph_calls()  # what this graph's functions need is kept now
    after = _graph_calls()
    # measured: signatures 6,875 -> 56 and parsers 100 -> 2 (Beam 2.61), 10,468 -> 49 and 169 -> 4 (Beam 2.77)
    for name in before:
        assert after[name] < before[name] / 10, (name, before, after)


class _Holder:
    def __init__(self, *held):
        self.held = held


def test_the_state_cache_weighs_every_value_as_beam_does_with_the_modules_listed_once():
    cut_overheads()
    assert statecache.get_deep_size is not BEAM_WEIGHT
    later = types.ModuleType("imagepipe_test_loaded_later")  # a module loaded after the list was first made
    later.table = {"rows": list(range(1000))}
    values = [
        b"x" * 10_000,
        [b"a" * 100, "b" * 200, 3, 4.5, None],
        {"k": np.zeros((64, 64, 3), np.uint8), "nested": {"list": [1, 2, 3]}},
        _Holder(json.__dict__, [1, 2]),  # a module's globals are shared: not weighed
        (),
    ]
    with mock.patch.object(traverse, "_iter_modules_globals", wraps=traverse._iter_modules_globals) as listed:
        weights = [statecache.get_deep_size(v) for v in values * 20]
        assert listed.call_count <= 1  # once for the modules loaded now, then never again for 100 values
        listed_before = listed.call_count
        sys.modules[later.__name__] = later
        try:
            held_later = _Holder(vars(later))
            weight_later = statecache.get_deep_size(held_later)
            assert listed.call_count == listed_before + 1  # a module loaded since: listed again
            assert weight_later == BEAM_WEIGHT(held_later)  # (Beam's own lists them on every call) left out
        finally:
            del sys.modules[later.__name__]
    assert weights == [BEAM_WEIGHT(v) for v in values * 20]
    assert statecache.get_deep_size(_Holder(json.__dict__)) < statecache.get_deep_size(_Holder(dict(json.__dict__)))


def test_a_graph_with_a_side_input_weighs_it_through_the_cut():
    cut_overheads()
    weighed = mock.patch.object(statecache, "get_deep_size", wraps=statecache.get_deep_size)
    with weighed as weigh, beam.Pipeline() as p:
        numbers = p | "numbers" >> beam.Create(range(10))
        total = p | "total" >> beam.Create([100]) | beam.CombineGlobally(sum)
        shifted = numbers | beam.Map(lambda n, extra: n + extra, beam.pvalue.AsSingleton(total))
        assert_that(shifted, equal_to([100 + n for n in range(10)]))
    assert weigh.call_count > 0


class _Windowed(beam.DoFn):
    def process(self, element, win=beam.DoFn.WindowParam):  # noqa: B008 - how Beam declares it
        yield element, win.start.micros // 1_000_000


def _windowed_graph_and_worker_pickles():
    """A graph whose ParDos need their windowing (fixed windows, a DoFn reading its window, a side input, state):
    its results checked, and how often Beam's worker pickled a DoFn again while building them."""
    real_dumps = pickler.dumps
    again = []

    def dumps(value, *args, **kwargs):
        callers = (sys._getframe(1), sys._getframe(2))  # the worker's call, or its pickler's (the cut's) for it
        if any(frame.f_code.co_name == "_create_pardo_operation" for frame in callers):
            again.append(value)
        return real_dumps(value, *args, **kwargs)

    with mock.patch.object(pickler, "dumps", dumps), beam.Pipeline() as p:
        stamped = (
            p
            | beam.Create([(n, n * 10) for n in range(6)])
            | beam.Map(lambda kv: window.TimestampedValue(kv[0], kv[1]))
            | beam.WindowInto(window.FixedWindows(30))
        )
        assert_that(
            stamped | "which window" >> beam.ParDo(_Windowed()),
            equal_to([(n, n * 10 // 30 * 30) for n in range(6)]),
            label="windows",
        )
        total = p | "total" >> beam.Create([100]) | beam.CombineGlobally(sum)
        shifted = stamped | beam.Map(lambda n, extra: n + extra, beam.pvalue.AsSingleton(total, default_value=0))
        assert_that(shifted, equal_to([100 + n for n in range(6)]), label="side input")  # global: seen by every window
        kv = p | "pairs" >> beam.Create([("a", "1"), ("a", "2"), ("b", "3")]) | beam.Map(lambda kv: kv)
        assert_that(kv | beam.ParDo(_Stateful()) | beam.combiners.Count.Globally(), equal_to([3]), label="state")
    return len(again)


def test_the_worker_builds_each_pardo_without_pickling_its_dofn_again():
    cut_overheads()
    with (
        mock.patch.object(bundle_processor, "pickler", pickler),
        mock.patch.object(pickler, "loads", pickler.loads.original),
    ):  # Beam as it is: the worker pickles the DoFns again
        assert _windowed_graph_and_worker_pickles() > 5
    assert _windowed_graph_and_worker_pickles() == 0  # the same results, with the windowing as Beam found it


def test_rewindowed_data_unpickles_as_the_pickled_copy_would():
    cut_overheads()
    worker = bundle_processor.pickler
    sent = pickler.dumps((_Stateful(), (1,), {"k": [2]}, [], None))
    data = worker.loads(sent)
    windowing = core.Windowing(window.FixedWindows(5))
    made = worker.dumps(data[:-1] + (windowing,))
    assert bytes(made) == sent  # the data as sent: nothing pickled
    first, second = pickler.loads(made), pickler.loads(made)
    for read in (first, second):  # each a new copy, the windowing put in
        assert isinstance(read[0], _Stateful) and read[1:4] == ((1,), {"k": [2]}, []) and read[4] is windowing
    assert first[0] is not second[0] and first[0] is not data[0] and first[2] is not second[2]
    # Anything else is pickled: another value, or the same data changed in more than its last place
    other = worker.dumps((_Stateful(), (1,), {"k": [2]}, [], windowing))
    assert type(other) is bytes and pickler.loads(other)[4] == windowing
    data = worker.loads(sent)
    changed = worker.dumps((data[0], (3,), data[2], data[3], windowing))
    assert type(changed) is bytes and pickler.loads(changed)[1] == (3,)
    assert type(worker.dumps(data[:-1] + (windowing,))) is bytes  # only right after the unpickling it matches
