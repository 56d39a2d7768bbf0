"""The two stacks (stacks/): which one this is, said in one line; Beam's local runner named, never downloaded; no
start-up noise from TensorFlow or Google's libraries on the modern stack; `make` choosing and refusing stacks."""

import os
import subprocess
import sys
from importlib import metadata

import pytest

import stacks
from pipeline.config import PROJECT_DIR

LOCKED = {"modern": ("1.21.0", "2.21.0", (3, 12)), "legacy": ("1.16.0", "2.16.2", (3, 10))}


def test_this_interpreter_runs_the_stack_its_lock_pins():
    tfx_version, tf_version, python = LOCKED[stacks.NAME]
    assert (metadata.version("tfx"), metadata.version("tensorflow")) == (tfx_version, tf_version)
    assert sys.version_info[:2] >= python
    assert stacks.describe() == (
        f"{stacks.NAME} stack: TFX {tfx_version}, TensorFlow {tf_version}, Python {'.'.join(map(str, sys.version_info[:3]))}"
    )
    lock = open(os.path.join(PROJECT_DIR, "stacks", f"{stacks.NAME}.lock")).read()
    assert f"\ntfx=={tfx_version} " in lock and f"\ntensorflow=={tf_version} " in lock


def _quiet_python(code: str, warnings_shown: bool = False) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter, as a command that is not --verbose starts (cli/common.py quiet_logs), with
    Python's warnings shown again if asked."""
    prelude = "import cli.common; cli.common.quiet_logs(False)\n"
    if warnings_shown:
        prelude += "import warnings; warnings.resetwarnings(); warnings.simplefilter('always')\n"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_command_starts_tensorflow_without_its_notices_but_keeps_its_errors():
    done = _quiet_python(
        "import tensorflow as tf\nprint(int(tf.constant(2) + 1))\nimport sys; print('a line of ours', file=sys.stderr)"
    )
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr
    assert done.stderr.strip().splitlines() == ["a line of ours"], done.stderr


@pytest.mark.skipif(stacks.NAME != "modern", reason="Python 3.10 is past its end of life: the legacy stack warns")
def test_no_google_library_warns_about_the_python_version_on_the_modern_stack():
    done = _quiet_python("import google.api_core, google.cloud.aiplatform, apache_beam, tfx.v1, kfp", True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "non-supported Python version" not in done.stderr and "Python version" not in done.stderr, done.stderr


def test_beam_runs_here_without_trying_to_download_a_runner(caplog):
    """Beam 2.70+'s DirectRunner first fetches PrismRunner from the internet: the runner `predict --workers` names
    never does."""
    import logging

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    caplog.set_level(logging.INFO)
    with beam.Pipeline(options=PipelineOptions([f"--runner={stacks.LOCAL_BEAM_RUNNER}"])) as pipeline:
        summed = pipeline | beam.Create([1, 2, 3]) | beam.CombineGlobally(sum)
        assert_that(summed, equal_to([6]))
    assert not [r for r in caplog.records if "prism" in r.getMessage().lower()], caplog.text


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args], cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not os.path.exists("/usr/bin/make"), reason="no make on this machine")
def test_make_says_which_stack_in_one_line_and_refuses_an_unknown_one():
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    native = "modern" if tuple(map(int, glibc.split(".")[:2])) >= (2, 39) else "legacy"
    said = _make("stack")
    assert said.returncode == 0 and said.stdout.count("\n") == 1, said
    assert said.stdout.startswith(f"stack: {native} (TFX {'1.21' if native == 'modern' else '1.16'}")
    forced = _make("stack", "STACK=legacy")
    assert forced.stdout.startswith("stack: legacy (TFX 1.16, TensorFlow 2.16, Python 3.10)"), forced
    refused = _make("stack", "STACK=newest")
    assert refused.returncode != 0 and "STACK=newest: use modern or legacy" in refused.stderr
