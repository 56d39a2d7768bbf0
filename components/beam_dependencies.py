"""No TFX package built for a Beam step that runs on this machine.

Given any Beam argument and none of --extra_packages, --setup_file, --requirements_file or a container image, TFX's
Beam executors (base_beam_executor) copy TFX's installed folder and build an sdist of it in a temporary folder for the
Beam workers to install (dependency_utils.make_beam_dependency_flags): 2.4 s and 49 MB a step, measured here, that
nothing deletes, and which Beam then stages. Workers of Beam's runners on this machine (LOCAL_RUNNERS,
or no --runner) are this machine's own processes, with TFX installed already: a run with `--beam-arg
--direct_num_workers=4` built six packages (300 MB in /tmp) for nothing. A remote runner keeps TFX's behaviour
(Dataflow: kubeflow/cloud_platform.py names the pipeline image, so TFX builds none there either).

Every Beam executor of the DAG mixes in `NoTfxPackageForLocalRunners` first (components/beam_settings.BeamConfigured
carries it to TFX's StatisticsGen, Transform and Evaluator executors).
"""

import contextlib
from typing import List

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from tfx.utils import dependency_utils

from stacks import IN_PROCESS_BEAM_RUNNERS

# Beam's runners on this machine: the in-process ones, and the DirectRunner of bundles.
LOCAL_RUNNERS = (*IN_PROCESS_BEAM_RUNNERS, "BundleBasedDirectRunner")


def runs_on_this_machine(beam_args: List[str]) -> bool:
    """Whether `beam_args` run Beam here (no --runner: Beam's DirectRunner)."""
    return (PipelineOptions(list(beam_args or [])).view_as(StandardOptions).runner or "DirectRunner") in LOCAL_RUNNERS


@contextlib.contextmanager
def _tfx_package_for_remote_runners_only():
    build_for = dependency_utils.make_beam_dependency_flags
    dependency_utils.make_beam_dependency_flags = lambda args: (
        list(args) if runs_on_this_machine(args) else build_for(args)
    )
    try:
        yield
    finally:
        dependency_utils.make_beam_dependency_flags = build_for


class NoTfxPackageForLocalRunners:
    """Mixed in before a TFX Beam executor: its constructor builds no TFX package when Beam runs here."""

    def __init__(self, context=None):
        with _tfx_package_for_remote_runners_only():
            super().__init__(context)
