"""`imagepipe compile | submit | schedule`: the pipeline compiled for Vertex AI or Kubeflow (kubeflow/)."""

import argparse

from cli.common import EXIT_BAD_INPUT, config_from_args, fail, quiet_logs, with_tuning
from pipeline.cloud_config import CloudConfig
from pipeline.config import ConfigError
from pipeline.runtime_parameters import runtime_values


def _cloud_settings(args: argparse.Namespace, need_host: bool = False):
    config = with_tuning(config_from_args(args), args, local=False).validate()
    cloud = config_from_args(args, CloudConfig).validate(config, need_host=need_host)
    return config, cloud


def cmd_compile(args: argparse.Namespace) -> int:
    config, cloud = _cloud_settings(args)
    quiet_logs(args.verbose)
    from kubeflow import deploy  # yaml, protobuf (~30 ms): not at the CLI's start-up, which imports this module

    output = deploy.compile_pipeline(config, cloud, args.output or deploy.default_output(config, cloud))
    kind = "PipelineJob for Vertex AI" if cloud.target == "vertex" else "PipelineSpec package for kfp.Client"
    print(
        f"wrote {output}: {kind}, image {cloud.image}, pipeline root {cloud.full_pipeline_root(config.pipeline_name)}"
    )
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    config, cloud = _cloud_settings(args, need_host=True)
    quiet_logs(args.verbose)
    from kubeflow import deploy  # yaml, protobuf (~30 ms): not at the CLI's start-up, which imports this module

    request = deploy.submit(config, cloud, dry_run=args.dry_run, parameters=runtime_values(config, args.param))
    print(("would submit (dry run, nothing sent):" if args.dry_run else "submitted:"))
    print("\n".join(deploy.describe_lines(request)))
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    config, cloud = _cloud_settings(args, need_host=True)
    if not cloud.cron:
        raise ConfigError("no schedule: give --cron '0 3 * * 1' (minute hour day-of-month month day-of-week)")
    quiet_logs(args.verbose)
    from kubeflow import deploy  # yaml, protobuf (~30 ms): not at the CLI's start-up, which imports this module

    try:
        request = deploy.schedule(config, cloud, dry_run=args.dry_run, parameters=runtime_values(config, args.param))
    except deploy.ScheduleExists as e:
        return fail(EXIT_BAD_INPUT, str(e))
    print(("would schedule (dry run, nothing sent):" if args.dry_run else "scheduled:"))
    print("\n".join(deploy.describe_lines(request)))
    return 0
