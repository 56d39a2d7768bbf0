"""The settings a compiled job's runs can change without recompiling: pipeline/pipeline.py makes them
RuntimeParameters, `imagepipe submit --param NAME=VALUE` and `tfx run create --runtime_parameter` give values, and
pipeline/run_check.py checks those values as the settings are checked, in the job's first task."""

import dataclasses
from typing import Any, Dict, List

from pipeline.config import PipelineConfig
from settings import kind, option
from storage.errors import ConfigError

# Runtime parameter name (the setting's) -> its type: the declarations marked `runtime` (settings.setting()).
RUNTIME_PARAMETERS = {f.name: kind(f) for f in dataclasses.fields(PipelineConfig) if f.metadata.get("runtime")}
_ONLY_WITH = {f.name: f.metadata["runtime"] for f in dataclasses.fields(PipelineConfig) if f.metadata.get("runtime")}


def runtime_values(config: PipelineConfig, given: List[str]) -> Dict[str, Any]:
    """`--param NAME=VALUE` values for the compiled job's runtime parameters, each checked as its setting is:
    an unknown name, a parameter the job does not have, or a bad value is one line, before anything is sent."""
    values: Dict[str, Any] = {}
    known = job_parameters(config)
    for item in given:
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in RUNTIME_PARAMETERS:
            raise ConfigError(f"--param {item!r}: use NAME=VALUE, NAME one of {', '.join(known)}")
        if name in values:
            raise ConfigError(f"--param {name}: given twice ({values[name]} and {raw}); give it once")
        if name not in known:
            raise ConfigError(f"--param {name}: this job has no such parameter (" + f"compile it with {needs(name)})")
        kind = RUNTIME_PARAMETERS[name]
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(
                f"--param {name}={raw!r}: not {'a whole number' if kind is int else 'a number'}"
            ) from None
        if name == "tune_trials" and value < 1:
            raise ConfigError(f"--param tune_trials={raw}: use 1 or more trials")
        try:
            dataclasses.replace(config, **{name: value}).validate()
        except ConfigError as e:
            raise ConfigError(f"--param {name}={raw}: {str(e).split(': ', 1)[-1]}") from None
        values[name] = value
    return values


def job_parameters(config: PipelineConfig) -> List[str]:
    """The runtime parameters a job compiled from `config` has, in declaration order."""
    return [name for name in RUNTIME_PARAMETERS if job_has_parameter(config, name)]


def job_has_parameter(config: PipelineConfig, name: str) -> bool:
    """Whether a job compiled from `config` has this runtime parameter: some only come with another setting given."""
    only_with = _ONLY_WITH[name]
    return only_with is True or bool(getattr(config, only_with))


def needs(name: str) -> str:
    """The option a job must be compiled with to have this runtime parameter, e.g. --tune N; "" for none."""
    if _ONLY_WITH[name] is True:
        return ""
    field = next(f for f in dataclasses.fields(PipelineConfig) if f.name == _ONLY_WITH[name])
    return option(field) + (f" {field.metadata['metavar']}" if field.metadata.get("metavar") else "")
