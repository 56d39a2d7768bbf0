"""One declaration per setting. A setting a user gives is a dataclass field made by `setting()`, declared where its
meaning lives:

  components/example_gen/ingest_defaults.py  Ingestion: what ImageExampleGen reads and how it writes
  components/validation/__init__.py          Gate: what the gates do with what they find
  components/drift.py                        Thresholds: the drift from the last blessed model's data
  components/health/__init__.py              LabelCheck, Limits: data health's
  trainer/hparams.py                         HParams: the training settings
  components/tuner/__init__.py               Search: the hyperparameter search
  components/evaluator/__init__.py           Blessing: what blesses a model, the threshold that goes with it
  pipeline/config.py                         PipelineConfig's own: where a run reads and writes, how it runs

From a declaration come PipelineConfig's field (pipeline/config.py, and so its IMAGEPIPE_<NAME> variable), its check
(`checked()`, one line naming the option), the `imagepipe run` option with its help (cli/parser.py), a component's
parameter where the component takes them (ImageExampleGen's), and a compiled job's runtime parameter where the
declaration says `runtime` (pipeline/runtime_parameters.py). The bottom layer: it imports nothing of the project.
"""

import dataclasses
from typing import Any, Callable, Iterable, Optional, Tuple, Union

SEED = 42  # the one default seed of a run (HParams.seed): ingestion's shuffle, the splits' order, weights, augmentation

# A check: (what a good value satisfies, what to do otherwise), e.g. (lambda v: v >= 1, "use 1 or more spans"); what
# to do may be a function of the value that says which part of it is wrong, then what to do (any_of's).
Check = Tuple[Callable[[Any], bool], Union[str, Callable[[Any], str]]]


def setting(
    default,
    help: str,
    choices: Optional[Tuple[str, ...]] = None,
    flag: Optional[str] = "",
    check: Optional[Check] = None,
    runtime: Union[bool, str] = False,
    metavar: Optional[str] = None,
):
    """A setting's declaration.

    default   its value when nobody gives one (a list default is given as a tuple, and copied)
    help      the option's help; `{default}` in it is the default (`{default:,}` with thousands separators)
    choices   the values it takes (checked)
    flag      its `imagepipe run` option when that is not --<name>; None: no option (an IMAGEPIPE_ variable only)
    check     (predicate, what to use instead) for values beyond `choices`
    metavar   the option's placeholder in --help (default: the name in capitals)
    runtime   True: a runtime parameter of compiled jobs, named as the setting; a field's name: only in jobs
              compiled with that setting given (span_window with span_pattern)
    """
    if runtime and type(default) not in (int, float):  # what pipeline/runtime_parameters.py checks and parses
        raise TypeError(f"setting({default!r}, runtime=...): runtime parameters are whole numbers or numbers")
    metadata = {"help": help, "choices": choices, "flag": flag, "check": check, "runtime": runtime, "metavar": metavar}
    if isinstance(default, (list, tuple)) and not isinstance(default, str):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def taken(cls, values):
    """A settings dataclass `cls` made from the fields of the same names that `values` holds (PipelineConfig holds
    every declared setting; IngestSettings the ingestion ones): one way, no field copied by hand."""
    return cls(**{f.name: getattr(values, f.name) for f in dataclasses.fields(cls)})


def declared(cls) -> list:
    """The settings a dataclass declares with setting(), in declaration order."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def option(field: dataclasses.Field) -> str:
    """How a user gives a declared setting (its errors name it): its `imagepipe run` option, e.g. --max-pixels, or
    for a setting without one (flag=None), its IMAGEPIPE_ variable."""
    if field.metadata.get("flag", "") is None:
        return f"IMAGEPIPE_{field.name.upper()}"
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def kind(field: dataclasses.Field) -> type:
    """A declared setting's plain type: int for Optional[int]; what a component parameter or a runtime parameter of
    it is made of (a bool travels as an int)."""
    plain = next((t for t in getattr(field.type, "__args__", ()) if t is not type(None)), field.type)
    return int if plain is bool else plain


def default_of(field: dataclasses.Field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def help_text(field: dataclasses.Field) -> str:
    return field.metadata["help"].format(default=default_of(field))


def problem(field: dataclasses.Field, value) -> Optional[str]:
    """What is wrong with this value of the setting, in one line naming its option; None when it is good."""
    if value is None and default_of(field) is None:
        return None  # not given: the setting's own "unset"
    choices, check = field.metadata.get("choices"), field.metadata.get("check")
    if choices and value not in choices:
        return f"{option(field)} {value!r}: use {', '.join(choices)}"
    if check and not check[0](value):
        what = check[1]
        return f"{option(field)} {what(value)}" if callable(what) else f"{option(field)} {value!r}: {what}"
    return None


def checked(values, fields: Iterable[dataclasses.Field], error=ValueError) -> None:
    """Raises `error` with the first declared setting whose value `values` (an object) holds is bad."""
    for field in fields:
        found = problem(field, getattr(values, field.name))
        if found:
            raise error(found)


def items(value: str) -> list:
    """A comma-separated setting's items."""
    return [item.strip() for item in value.split(",") if item.strip()]


def any_of(choices: Tuple[str, ...]) -> Check:
    """A comma-separated list of some of `choices`; its error names the items that are not."""

    def unknown(value: str) -> list:
        return sorted(set(items(value)) - set(choices))

    return (lambda v: not unknown(v), lambda v: f"{','.join(unknown(v))}: use {', '.join(choices)}")


def fraction(none_means: str = "") -> Check:
    """A share from 0 to 1 (both included)."""
    return (lambda v: 0 <= v <= 1, "use a fraction from 0 to 1" + (f" ({none_means})" if none_means else ""))
