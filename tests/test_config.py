"""Pipeline configuration: environment overrides, remote paths, one-line errors."""

import pytest

from pipeline.config import ConfigError, PipelineConfig
from pipeline.environment import from_environment


def test_environment_overrides_with_types():
    config = from_environment(
        PipelineConfig(),
        {
            "IMAGEPIPE_IMAGE_SIZE": "64",
            "IMAGEPIPE_EVAL_PERCENT": "25",
            "IMAGEPIPE_DROP_DUPLICATES": "true",
            "IMAGEPIPE_MAX_BAD_FRACTION": "0.2",
            "IMAGEPIPE_BEAM_ARGS": "--a=1 --b=2",
            "IMAGEPIPE_WEIGHTS": "",
            "IMAGEPIPE_TFLITE": "",
            "IMAGEPIPE_EXPORTS": "",
        },
    )  # empty: none, as leaving the option out
    assert (config.image_size, config.eval_percent, config.drop_duplicates) == (64, 25, True)
    assert (config.max_bad_fraction, config.beam_args, config.weights) == (0.2, ["--a=1", "--b=2"], "")
    assert (config.tflite, config.exports) == ("", "")
    with pytest.raises(ConfigError, match="IMAGEPIPE_EPOCHS='many'"):
        from_environment(PipelineConfig(), {"IMAGEPIPE_EPOCHS": "many"})


def test_remote_data_paths_are_kept_as_they_are():
    assert PipelineConfig(data="gs://bucket/images").data_path() == "gs://bucket/images"
    assert PipelineConfig(data="relative/dir").data_path().endswith("/relative/dir")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model": "efficientnet_b0", "image_size": 16}, "--image-size 16: use 32 to 1024 pixels for efficientnet_b0"),
        ({"augment": "flip,spin"}, "augment spin"),
        ({"accuracy_threshold": 1.5}, "--accuracy-threshold 1.5"),
        ({"weights": "/no/such/weights.h5", "model": "mobilenet_v2"}, "--weights /no/such/weights.h5: no such file"),
        ({"near_duplicates": "delete"}, "--near-duplicates 'delete': use report, drop, off"),
        ({"label_check": "yes"}, "--label-check 'yes': use auto, on, off"),
        ({"max_label_issues": 5.0}, "--max-label-issues 5.0: use a fraction from 0 to 1 (1: no check)"),
        ({"max_eval_near_duplicates": -0.1}, "--max-eval-near-duplicates -0.1: use a fraction"),
        ({"max_feature_drift": -1.0}, "--max-feature-drift -1.0: use 0 or more"),
    ],
)
def test_bad_settings_are_one_line_config_errors(changes, message):
    with pytest.raises(ConfigError) as caught:
        PipelineConfig(**changes).validate()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_training_settings_are_declared_once_and_reach_config_cli_and_trainer():
    """trainer/hparams.py declares each training setting; the config field, the `imagepipe run` option and the
    Trainer's value all come from that one declaration, with its default."""
    import dataclasses

    from cli.common import config_from_args
    from cli.parser import build_parser
    from settings import declared as declared_in
    from trainer.hparams import HParams

    declared = declared_in(HParams)
    fields = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    run = build_parser().parse_args(["run"])
    options = {a.dest: a for a in build_parser().commands["run"]._actions}
    for setting in declared:
        assert setting.name in fields and setting.name in options, setting.name
        if setting.name != "image_size":  # the config's None: the model's usual input side
            assert fields[setting.name].default == setting.default == getattr(HParams(), setting.name)
        assert options[setting.name].help.startswith(setting.metadata["help"].split("{")[0][:20])
    # Every config field a user sets has an option, and an option's value reaches the Trainer's settings.
    # --retune sets tune_mode, --model auto model_choice; shard_megabytes is an IMAGEPIPE_ variable only
    not_options = {"tune_mode", "model_choice", "shard_megabytes"}
    assert set(fields) - set(options) - not_options == set(), set(fields) - set(options)
    args = build_parser().parse_args(
        ["run", "--epochs", "7", "--class-balance", "off", "--nondeterministic", "--seed", "3"]
    )
    hp = config_from_args(args).hparams()
    assert (hp.epochs, hp.class_balance, hp.deterministic, hp.seed) == (7, "off", False, 3)
    assert run.epochs is None  # not given: the config's default stands
    # One seed default: ingestion shuffles with the run's seed.
    from components.example_gen.ingest_settings import IngestSettings

    assert IngestSettings().seed == HParams.seed == PipelineConfig().seed


def test_data_health_limits_are_declared_once_and_reach_config_cli_and_the_component():
    """components/health declares each limit; the config field, the option and DataHealth's parameter follow."""
    import dataclasses

    from cli.common import config_from_args
    from cli.parser import build_parser
    from components.health import Limits
    from components.health.component import DataHealthSpec

    options = {a.dest: a for a in build_parser().commands["run"]._actions}
    fields = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    for limit in dataclasses.fields(Limits):
        assert fields[limit.name].default == limit.default and limit.name in options
        assert limit.name in DataHealthSpec.PARAMETERS
    config = config_from_args(build_parser().parse_args(["run", "--max-label-issues", "0.05"]))
    assert config.health_limits() == Limits(max_label_issues=0.05)
    with pytest.raises(ConfigError, match=r"^--max-label-issues 2.0: use a fraction from 0 to 1"):
        dataclasses.replace(config, max_label_issues=2.0).validate()


def test_ingestion_settings_are_declared_once_and_reach_config_cli_component_and_executor():
    """components/example_gen/ingest_defaults.py declares each ingestion setting; the config field, the option, its
    check, ImageExampleGen's parameter and what the executor reads all follow from the declaration: a new setting is
    one field (the note of issue 53 says how one was added in a test branch)."""
    import dataclasses

    from tfx.utils import proto_utils

    from cli.common import config_from_args
    from cli.parser import build_parser
    from components.example_gen.ingest_defaults import IN_TFX_CONFIGS, Ingestion
    from components.example_gen.ingest_settings import IngestSettings
    from pipeline import platform
    from pipeline.pipeline import create_pipeline

    options = {a.dest: a for a in build_parser().commands["run"]._actions}
    fields = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    for declared in dataclasses.fields(Ingestion):
        assert fields[declared.name].default == declared.default, declared.name
        assert declared.name in options or declared.metadata["flag"] is None, declared.name
    # Values given as options reach the executor's settings through the compiled component's parameters.
    given = {"max_pixels": 1234567, "store_max_pixels": 0, "near_duplicates": "off", "task": "single"}
    args = build_parser().parse_args(
        ["run", "--model", "cnn", "--drop-duplicates", "--compression-level", "3"]
        + [arg for name, value in given.items() for arg in (f"--{name.replace('_', '-')}", str(value))]
    )
    config = config_from_args(args).validate()
    example_gen = next(
        c for c in create_pipeline(config, platform.local(config)).components if c.id == "ImageExampleGen"
    )
    props = {
        k: proto_utils.proto_to_json(v) if hasattr(v, "DESCRIPTOR") else v
        for k, v in example_gen.exec_properties.items()
    }
    read = IngestSettings.from_exec_properties(props)
    for name, value in {**given, "drop_duplicates": True, "compression_level": 3}.items():
        assert getattr(read, name) == value, name
    for name in {f.name for f in dataclasses.fields(Ingestion)} - set(IN_TFX_CONFIGS):
        assert getattr(read, name) == getattr(config, name), name
    # Each declared check: one line naming the option.
    with pytest.raises(ConfigError, match=r"^--compression-level 12: use 0 \(none\) to 9$"):
        PipelineConfig(compression_level=12).validate()


def test_a_renamed_variable_or_a_refused_parameter_is_one_line_never_ignored():
    """IMAGEPIPE_TUNE (the trial count's old name) would turn the search off without a word: it is refused, naming
    the new variable. A setting with no option is named by its variable. An ImageExampleGen parameter its
    declaration refuses (a compiled job edited by hand) stops ingestion in one line; "" means unset."""
    from components.example_gen.ingest_defaults import PARAMETERS
    from components.example_gen.ingest_settings import _parameter

    with pytest.raises(ConfigError, match=r"^IMAGEPIPE_TUNE is now IMAGEPIPE_TUNE_TRIALS"):
        from_environment(PipelineConfig(), {"IMAGEPIPE_TUNE": "5"})
    assert from_environment(PipelineConfig(), {"IMAGEPIPE_TUNE_TRIALS": "5"}).tune_trials == 5
    with pytest.raises(ConfigError, match=r"^IMAGEPIPE_SHARD_MEGABYTES 0: use 1 or more$"):
        PipelineConfig(shard_megabytes=0).validate()
    declared = {f.name: f for f in PARAMETERS}
    with pytest.raises(ValueError, match=r"^ImageExampleGen parameter max_pixels: use a positive number of pixels$"):
        _parameter(declared["max_pixels"], 0)
    assert _parameter(declared["layout"], "") == "auto" and _parameter(declared["store_max_pixels"], 0) == 0
    assert _parameter(declared["drop_duplicates"], 1) is True
