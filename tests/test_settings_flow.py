"""A new setting of each kind reaches everything with only its declaration and its use edited (issue 64): in a
temporary copy of the project, an ingestion setting that is also a runtime parameter (--min-side, images with a
shorter side are quarantined) and a training setting (--adam-epsilon, the optimizer's epsilon) are added as a
developer would add them, and each is shown to work from the command line, the environment, `--param`, the
compiled job, ImageExampleGen's parameters, the per-file code, the Trainer's hyperparameters and the model card."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pipeline.config import PROJECT_DIR

pytestmark = pytest.mark.slow  # TFX, Kubeflow's compiler and Keras imported in a fresh process

# (file, what is there, what it becomes, how many times): a declaration, then its use. Nothing else changes.
EDITS = [
    (  # an ingestion setting that is also a runtime parameter: its declaration
        "components/example_gen/ingest_defaults.py",
        "    shard_megabytes: int = setting(",
        '    min_side: int = setting(0, "quarantine images with a side under N pixels", check=(lambda v: v >= 0, '
        '"use 0 or more"), runtime=True)\n    shard_megabytes: int = setting(',
        1,
    ),
    (  # ... and its use, in the per-file code
        "components/example_gen/writing/batch_ingest.py",
        "    return Inspected(None, data, info, stored, stored_info)\n",
        "    if min(info.width, info.height) < settings.declared.min_side:\n"
        '        return bad("too_small", f"{info.width}x{info.height}: a side under --min-side")\n'
        "    return Inspected(None, data, info, stored, stored_info)\n",
        1,
    ),
    (  # a training setting: its declaration
        "trainer/hparams.py",
        "    mixed_precision: str = setting(",
        '    adam_epsilon: float = setting(1e-7, "Adam\'s epsilon", check=(lambda v: 0 < v < 1, "use 0 to 1"))\n'
        "    mixed_precision: str = setting(",
        1,
    ),
    (  # ... and its use, in the model code
        "trainer/models.py",
        "optimizer=keras.optimizers.Adam(learning_rate),",
        "optimizer=keras.optimizers.Adam(learning_rate, epsilon=hp.adam_epsilon),",
        2,
    ),
]

# What the copy is asked, in one process; each line it prints is checked below.
PROBE = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    from PIL import Image
    from cli.common import config_from_args
    from cli.parser import build_parser
    from pipeline.config import SAMPLE_SCHEMA, ConfigError, PipelineConfig
    from pipeline.environment import from_environment
    from pipeline.runtime_parameters import RUNTIME_PARAMETERS, runtime_values

    out = {}
    args = build_parser().parse_args(["run", "--data", sys.argv[1], "--model", "cnn", "--min-side", "32", "--adam-epsilon", "0.001"])
    config = config_from_args(args).validate()
    out["cli"] = [config.min_side, config.adam_epsilon]
    env = from_environment(PipelineConfig(), {"IMAGEPIPE_MIN_SIDE": "16", "IMAGEPIPE_ADAM_EPSILON": "0.01"})
    out["environment"] = [env.min_side, env.adam_epsilon]
    try:
        dataclasses.replace(config, min_side=-1).validate()
    except ConfigError as e:
        out["refused"] = str(e)
    out["runtime"] = "min_side" in RUNTIME_PARAMETERS and runtime_values(config, ["min_side=24"])
    from kubeflow import deploy
    from pipeline.cloud_config import CloudConfig
    cloud_config = dataclasses.replace(config, data="gs://bucket-1/images", schema=SAMPLE_SCHEMA)
    cloud = CloudConfig(project="proj-1", region="europe-west4", pipeline_root="gs://bucket-1/pipelines",
                        image="europe-docker.pkg.dev/proj-1/imagepipe/pipeline:v1").validate(cloud_config)
    spec = deploy.build_job(cloud_config, cloud)["pipelineSpec"]
    out["job"] = ["min_side" in spec["root"]["inputDefinitions"]["parameters"],
                  spec["root"]["dag"]["tasks"]["ImageExampleGen"]["inputs"]["parameters"]["min_side"]]
    try:
        runtime_values(config, ["min_side=-3"])
    except ConfigError as e:
        out["param_refused"] = str(e)

    from pipeline import platform
    from pipeline.pipeline import create_pipeline
    local = create_pipeline(config, platform.local(config))
    example_gen = next(c for c in local.components if c.id == "ImageExampleGen")
    out["component"] = example_gen.exec_properties["min_side"]

    from components.example_gen.ingest_defaults import Ingestion
    from components.example_gen.writing import batch_ingest
    from images.finding.listing import Candidate
    settings = batch_ingest.Settings(Ingestion(min_side=32), sys.argv[2], {"a": 0}, ["train"])
    found = []
    for side in (20, 40):
        path = f"{sys.argv[2]}/{side}.png"
        Image.new("RGB", (side, 60), (9, 9, 9)).save(path)
        candidate = Candidate(path, f"{side}.png", "a", None, os.path.getsize(path))
        found.append(batch_ingest.inspect(candidate, settings).bad)
    out["inspected"] = found

    from trainer import models
    hp = config.hparams()
    model = models.build(dataclasses.replace(hp, model="cnn", image_size=32), 2)
    models.compile_model(model, hp)
    out["optimizer_epsilon"] = float(model.optimizer.epsilon)
    out["custom_config"] = json.loads(json.dumps(hp.to_custom_config()))["adam_epsilon"]
    from components.model_card.render import CARD_SETTINGS
    out["card"] = "adam_epsilon" in CARD_SETTINGS
    print(json.dumps(out))
    """
)


def _copy_with_edits(dest: str) -> None:
    listed = subprocess.run(["git", "-C", PROJECT_DIR, "ls-files"], capture_output=True, text=True, check=True)
    for name in listed.stdout.splitlines():
        source = os.path.join(PROJECT_DIR, name)
        if os.path.isfile(source):  # tracked files only: no venv, no outputs
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copyfile(source, os.path.join(dest, name))
    for name, there, becomes, times in EDITS:
        path = os.path.join(dest, name)
        text = open(path).read()
        assert text.count(there) == times, f"{name}: the place of the edit moved; update EDITS"
        open(path, "w").write(text.replace(there, becomes))


def test_a_new_setting_of_each_kind_needs_only_its_declaration_and_its_use(tmp_path):
    copy = tmp_path / "project"
    _copy_with_edits(str(copy))
    data = tmp_path / "data" / "a"
    data.mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(data.parent), str(work)],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},  # the copy before the installed project
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    import json

    out = json.loads(probe.stdout.strip().splitlines()[-1])
    assert out["cli"] == [32, 0.001] and out["environment"] == [16, 0.01]
    assert out["refused"] == "--min-side -1: use 0 or more"  # its check, in the one-line wording
    assert out["runtime"] == {"min_side": 24} and out["param_refused"] == "--param min_side=-3: use 0 or more"
    assert out["job"] == [True, {"componentInputParameter": "min_side"}]  # a pipeline parameter ImageExampleGen reads
    assert out["component"] == 32  # ImageExampleGen's parameter
    too_small, kept = out["inspected"]
    assert too_small["reason"] == "too_small" and "20x60" in too_small["detail"] and kept is None
    assert out["optimizer_epsilon"] == pytest.approx(0.001, rel=1e-6) and out["custom_config"] == 0.001
    assert out["card"] is True
