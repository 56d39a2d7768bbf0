"""IMAGEPIPE_<FIELD> environment variables (IMAGEPIPE_ROOT, IMAGEPIPE_EVAL_PERCENT, ...) applied to a
PipelineConfig, each read as its field's kind, or a one-line error naming the variable."""

import dataclasses
import os

from storage.errors import ConfigError

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# Settings whose empty value is a choice: no backbone weights (random), no augmentation, no TFLite export.
_EMPTY_MEANS_NONE = {"weights", "augment", "tflite", "exports"}


def _env_value(field: dataclasses.Field, raw: str):
    kind = str(field.type)  # e.g. "<class 'int'>", "typing.Optional[int]", "typing.List[str]"
    if "List" in kind:
        return raw.split()
    if raw.strip() == "":
        if "Optional" in kind:
            return None
        if field.name not in _EMPTY_MEANS_NONE:
            raise ValueError("empty")
    if "int" in kind:
        return int(raw)
    if "float" in kind:
        return float(raw)
    if "bool" in kind:
        value = raw.strip().lower()
        if value not in _TRUE + _FALSE:
            raise ValueError("not a yes/no value")
        return value in _TRUE
    return raw


def _env_kind(field: dataclasses.Field) -> str:
    kind = str(field.type)
    return (
        "1 or 0 (true/false, yes/no, on/off)"
        if "bool" in kind
        else "a whole number"
        if "int" in kind
        else "a number"
        if "float" in kind
        else "a value"
    )


# Variables of settings since renamed: set, they would be ignored without a word.
RENAMED = {"IMAGEPIPE_TUNE": "IMAGEPIPE_TUNE_TRIALS"}


def from_environment(config, environ=os.environ):
    """Applies IMAGEPIPE_<FIELD> variables (e.g. IMAGEPIPE_ROOT, IMAGEPIPE_EVAL_PERCENT) to a config.

    A value that is empty (for a setting that has no "unset") or not of the setting's kind is one
    line naming the variable: never a silent default (IMAGEPIPE_ROOT= would write into the current folder)."""
    for old, new in RENAMED.items():
        if old in environ:
            raise ConfigError(f"{old} is now {new} (the setting's one name); rename the variable")
    changes = {}
    for field in dataclasses.fields(config):
        name = f"IMAGEPIPE_{field.name.upper()}"
        raw = environ.get(name)
        if raw is not None:
            try:
                changes[field.name] = _env_value(field, raw)
            except ValueError:
                raise ConfigError(
                    f"{name}={raw!r}: {'empty' if not raw.strip() else 'not ' + _env_kind(field)}; "
                    f"give {_env_kind(field)}, or unset the environment variable"
                ) from None
    return dataclasses.replace(config, **changes)
