"""The runner file for the TFX CLI on Vertex AI Pipelines:

    tfx pipeline create  --engine=vertex --pipeline_path=kubeflow/vertex_runner.py [--build_image]
    tfx pipeline update  --engine=vertex --pipeline_path=kubeflow/vertex_runner.py
    tfx pipeline compile --engine=vertex --pipeline_path=kubeflow/vertex_runner.py
    tfx run create       --engine=vertex --project P --region R --pipeline_name NAME [--runtime_parameter epochs=20]

Run from the project root: --build_image builds ./Dockerfile, the project's image. `tfx run create` sends no
service account and no labels, and its parameter values unchecked; the job's first task (RunCheck,
pipeline/run_check.py) checks both the values and the account the run executes as (docs/cloud.md).

NAME is IMAGEPIPE_NAME, or derived from IMAGEPIPE_DATA (e.g. images-3f2a9c; `tfx pipeline create`
prints it).

Settings come from IMAGEPIPE_* environment variables (pipeline/config.py: IMAGEPIPE_PROJECT,
IMAGEPIPE_PIPELINE_ROOT, IMAGEPIPE_IMAGE, IMAGEPIPE_DATA, ...), the same ones `imagepipe compile`
reads. The DAG is create_pipeline(), as for the local runner.
"""

import os
import sys

from kubeflow import deploy
from pipeline.cloud_config import CloudConfig
from pipeline.config import PipelineConfig
from pipeline.environment import from_environment


def run() -> None:
    config = from_environment(PipelineConfig()).validate()
    cloud = from_environment(CloudConfig(target="vertex")).validate(config)
    # IMAGEPIPE_OUTPUT: where to write the job (not a pipeline setting; `imagepipe compile --output`).
    output = os.environ.get("IMAGEPIPE_OUTPUT") or deploy.default_output(config, cloud)
    deploy.build_job(config, cloud, output)


if __name__ == "__main__":
    from storage.errors import ConfigError, DataError, one_line

    try:
        run()
    except (ConfigError, DataError) as e:  # the TFX CLI runs this file in its process: one line, not a traceback
        sys.exit(f"imagepipe: error: {one_line(str(e))}")
