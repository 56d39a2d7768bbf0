"""RunCheck: the first task of a compiled job. It checks the run's runtime parameters and the identity the run
executes as, before any other task starts.

`imagepipe submit --param epochs=20` checks each value before sending and passes the service account. But a run
can also be started by `tfx run create --runtime_parameter epochs=0`, the Vertex console, or a schedule made
elsewhere. The TFX CLI sends the values as they were typed (the Vertex client parses only their type) and sends
no service account, so the job runs as the project's default compute account. Every task of this pipeline
waits for this one. A value out of range, or a run on Google Cloud executing as another account than the
--service-account the job was compiled for, fails it at once, in one line naming the parameter or the account.

    check = RunCheck(epochs=RuntimeParameter("epochs", int), ..., service_account="runner@p.iam.gserviceaccount.com")
    example_gen.add_upstream_node(check)
"""

import os
import urllib.request
from typing import Optional

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types.component_spec import ExecutionParameter

from pipeline.config import ConfigError, PipelineConfig
from pipeline.runtime_parameters import RUNTIME_PARAMETERS, runtime_values

# The GCE metadata server (Vertex AI tasks run on Compute Engine); GCE_METADATA_HOST overrides it, as in google-auth.
METADATA_HOST = "metadata.google.internal"
EMAIL_PATH = "/computeMetadata/v1/instance/service-accounts/default/email"


class RunSettingsError(ValueError):
    """A runtime parameter out of range, or the run executing as another account; one line."""


def on_google_cloud() -> bool:
    """Whether this machine is on Google Cloud (a metadata server to ask): GCE_METADATA_HOST set, or the DMI
    product name of GCE, GKE and Vertex AI workers."""
    return bool(os.environ.get("GCE_METADATA_HOST")) or product_name().startswith("Google")


def product_name() -> str:
    """The machine's DMI product name ('Google Compute Engine' on GCE, GKE and Vertex workers), or ""."""
    try:
        with open("/sys/class/dmi/id/product_name") as f:
            return f.read().strip()
    except OSError:
        return ""


def running_as(timeout: float = 10.0) -> Optional[str]:
    """The service account this process runs as (the metadata server's default account), or None off Google
    Cloud."""
    if not on_google_cloud():
        return None
    host = os.environ.get("GCE_METADATA_HOST") or METADATA_HOST
    request = urllib.request.Request(f"http://{host}{EMAIL_PATH}", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - the metadata server's URL
        return answer.read().decode().strip()


def check(values: dict, service_account: str = "") -> None:
    """RunSettingsError for the first bad value of `values` ({runtime parameter: value}), each checked as
    `imagepipe submit --param` checks it, or for a run executing as another account than `service_account`."""
    # The job's own settings do not reach this task: only what decides which parameters the job has.
    config = PipelineConfig(
        tune_trials=1 if values.get("tune_trials") is not None else 0,
        span_pattern="span-{SPAN}" if values.get("span_window") is not None else None,
    )
    given = [f"{name}={value}" for name, value in values.items() if value is not None]
    try:
        runtime_values(config, given)
    except ConfigError as e:
        raise RunSettingsError(f"runtime parameter {str(e).removeprefix('--param ')}; nothing ran") from None
    actual = running_as() if service_account else None
    if actual is not None and actual != service_account:
        raise RunSettingsError(
            f"this run executes as {actual}, not {service_account}, the --service-account it was compiled for: it "
            "was started without it (`tfx run create` cannot pass one); start runs with `imagepipe submit`, or "
            "compile without --service-account to run as the default account; nothing ran"
        )


class RunCheckSpec(types.ComponentSpec):
    """Each runtime parameter (pipeline/runtime_parameters.py, from the declarations), the job's own (comma-separated
    in job_parameters: span_window and tune_trials are only in some jobs), and the account the job was compiled for."""

    PARAMETERS = {
        **{name: ExecutionParameter(type=kind, optional=True) for name, kind in RUNTIME_PARAMETERS.items()},
        "job_parameters": ExecutionParameter(type=str, optional=True),
        "service_account": ExecutionParameter(type=str, optional=True),
    }
    INPUTS: dict = {}
    OUTPUTS: dict = {}


class RunCheckExecutor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        names = [name for name in (exec_properties.get("job_parameters") or "").split(",") if name]
        check({name: exec_properties.get(name) for name in names}, exec_properties.get("service_account") or "")


# The executor's name in jobs compiled before RunCheck was a class (a function component's): their runs still check.
RunCheck_Executor = RunCheckExecutor


class RunCheck(base_component.BaseComponent):
    SPEC_CLASS = RunCheckSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(RunCheckExecutor)

    def __init__(self, job_parameters: str = "", service_account: str = "", **values):
        """`values`: the job's runtime parameters by name (RuntimeParameters in a compiled job)."""
        super().__init__(
            spec=RunCheckSpec(job_parameters=job_parameters, service_account=service_account or None, **values)
        )
