"""The pre-flight of a local run: everything checked, and settled, before anything is written or TFX is imported.

`prepare(config)` checks the settings once (PipelineConfig.validate), makes the digits sample when it is the input,
then `preflight`: the input listed as ImageExampleGen will list it (a one-line DataError on unusable data), the
machine's memory, Beam arguments and cluster, the schema, --model auto's choice and its weights; then --root (outside
the data, writable, not another pipeline's). It returns `Prepared(config, found)`: the configuration as the run will
be (the model chosen, an earlier search's trials) and what the input holds (source, layout, files, classes). A
mistake is one line, and nothing is written before it. pipeline/local_runner.py runs what it prepared.
"""

import dataclasses
import json
import os
import socket
import tempfile
import urllib.parse
from typing import Any, Dict, NamedTuple

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

import stacks
from components.tuner import SEARCH_FILE
from images.finding import sources
from pipeline import model_choice, sample_data
from pipeline.config import ConfigError, PipelineConfig, machine_memory_bytes
from pipeline.pipeline_inputs import example_gen_base, example_gen_input
from storage import files as fs
from storage.relocation import relocate
from trainer import efficientnet_lite
from trainer.hparams import AUTO, BACKBONES
from trainer.imagenet_weights import PACKAGED_WEIGHTS, imagenet_weights, imagenet_weights_path


class Prepared(NamedTuple):
    """A local run ready to start: its configuration as it will run (--model auto's choice, an earlier search's
    trials) and what preflight() found in the input (source, layout, files, classes, model_choice)."""

    config: PipelineConfig
    found: Dict[str, Any]


def preflight(config: PipelineConfig) -> Prepared:
    """Lists the input as ImageExampleGen will, fails fast on unusable data, and settles the model (--model auto's
    choice from the listed images, its settings and weights checked once).

    Cheap on purpose (no TFX import unless spans must be resolved): bad input is
    reported in a second, before anything is written. `config` is validated (prepare() does it).
    """
    config.check_memory(machine_memory_bytes())
    check_local_beam_args(config.beam_args)
    check_no_cluster()
    schema = config.schema_path()
    if schema and not fs.is_remote(schema):
        check_schema(schema)
    data = config.data_path()
    if not fs.exists(data):
        raise sources.DataError(f"--data {data}: no such file or folder; check the path")
    if os.path.isfile(data) and not data.lower().endswith((".csv", ".jsonl")):
        raise sources.DataError(
            f"--data {data}: a file, but not a .csv manifest or an AutoML import file (.csv, "
            ".jsonl); give a folder of class subfolders, a CSV with a path,label[,split] header, "
            "or a Vertex AI AutoML import file"
        )
    base = example_gen_base(config)
    pattern = example_gen_input(config).splits[0].pattern
    if config.span_pattern:
        # TFX (~12 s): only spans need it; the pre-flight stays cheap, its mistakes one line in a second
        from tfx.components.example_gen import utils as example_gen_utils

        splits = example_gen_input(config).splits
        try:
            example_gen_utils.calculate_splits_fingerprint_span_and_version(base, splits)
        except ValueError:
            raise sources.DataError(
                f"--data {base}: nothing matches --span-pattern {config.span_pattern!r}; "
                "check the pattern against the span folder names"
            ) from None
        pattern = splits[0].pattern  # now with the latest span filled in
    source = base if pattern in (".", "") else fs.join(base, pattern)
    listing = sources.list_source(base, source, config.layout, task=config.task)
    sources.check_usable(listing)
    choice = model_choice.choose([c.uri for c in listing.candidates if not c.problem]) if config.model == AUTO else None
    resolved = model_choice.resolved(config, choice)
    check_imagenet_weights(resolved)  # the model-dependent checks only: cheap
    found = {
        "source": source,
        "layout": listing.layout,
        "files": len(listing.candidates),
        "classes": listing.classes,
        "model_choice": choice,
    }
    return Prepared(resolved, found)


# Beam runners that run on this machine (LocalDagRunner's components run Beam in-process).
LOCAL_RUNNERS = (
    "DirectRunner",
    "direct",
    "FnApiRunner",
    "BundleBasedDirectRunner",
    "SwitchingDirectRunner",
    "PrismRunner",
    stacks.FN_API_RUNNER,
)


def check_local_beam_args(beam_args) -> None:
    """A --beam-arg runner that cannot run here is one line (DataflowRunner failed with "Pipeline has
    validations errors:" and nothing after it)."""
    for n, arg in enumerate(beam_args):
        runner = (
            arg.split("=", 1)[1]
            if arg.startswith("--runner=")
            else (beam_args[n + 1] if arg == "--runner" and n + 1 < len(beam_args) else None)
        )
        if runner is not None and runner not in LOCAL_RUNNERS:
            raise ConfigError(
                f"--beam-arg --runner={runner}: `imagepipe run` runs Beam on this machine "
                f"({', '.join(LOCAL_RUNNERS[:3])}); for Dataflow, run the pipeline on Vertex AI "
                "with `imagepipe submit --dataflow`"
            )


def check_no_cluster(environ=os.environ) -> None:
    """A TF_CONFIG naming several training machines cannot train in `imagepipe run`: its Trainer runs in this
    process after the other steps have started TensorFlow, and MultiWorkerMirroredStrategy must be made before
    ("Collective ops must be configured at program startup", after ingestion and Transform). One line, at once."""
    if not environ.get("TF_CONFIG"):
        return
    from trainer import strategy  # TensorFlow (~4 s): only a TF_CONFIG needs it

    try:
        cluster = strategy.training_cluster(environ)
    except strategy.TrainingDeviceError as e:
        raise ConfigError(str(e)) from None
    if cluster:
        machines = sum(len(cluster["cluster"].get(k, [])) for k in ("chief", "worker"))
        raise ConfigError(
            f"TF_CONFIG names a cluster of {machines} training machines, which `imagepipe run` cannot "
            "train on (its Trainer shares this process with the other steps); unset TF_CONFIG to train "
            "here, or train on several machines with `imagepipe submit --vertex-training "
            f"--training-replicas {machines}` (docs/training.md)"
        )


def check_imagenet_weights(config: PipelineConfig, timeout: float = 5.0) -> None:
    """--weights imagenet (the transfer models' default) where Keras cannot download them, or where the installed
    package's file is missing or not the expected one, is one early line, not a traceback from the features step
    after ingestion and validation."""
    hp = config.hparams()
    if hp.model not in BACKBONES or hp.weights != "imagenet":
        return

    if hp.model in PACKAGED_WEIGHTS:
        try:
            efficientnet_lite.check_packaged(imagenet_weights_path(hp.model, hp.image_size))
        except efficientnet_lite.WeightsError as e:
            raise ConfigError(f"--weights imagenet: {e}") from None
        return

    _, url = imagenet_weights(hp.model, hp.image_size)
    cached = imagenet_weights_path(hp.model, hp.image_size)
    if os.path.exists(cached):
        return
    try:
        socket.create_connection((urllib.parse.urlsplit(url).hostname, 443), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(
            f"--weights imagenet: the {hp.model} ImageNet weights are not on this machine ({cached}) "
            f"and cannot be downloaded ({e.strerror or type(e).__name__}); download {url} elsewhere "
            "and give --weights PATH"
        ) from None


def check_root_outside_data(config: PipelineConfig) -> None:
    """--root inside --data (or equal to it) would have the pipeline ingest its own metadata and artifacts."""
    data = config.data_path()
    if config.uses_sample_data or "://" in data:
        return
    root, data = os.path.realpath(config.root), os.path.realpath(data)
    if os.path.isfile(data):
        return  # a manifest names its files: nothing else in its folder is read
    if root == data or root.startswith(data.rstrip(os.sep) + os.sep):
        raise ConfigError(
            f"--root {config.root} is inside --data {config.data}: the pipeline would ingest its own "
            "metadata and artifacts; give a --root outside the data folder"
        )


def check_root(config: PipelineConfig) -> None:
    """--root must be a folder this process can write in (and a valid ML Metadata store, if any)."""
    from runs import run_store  # ML Metadata (~0.2 s): only the check of --root opens the store

    root = config.root
    try:
        os.makedirs(os.path.dirname(config.metadata_path), exist_ok=True)  # the store's folder, and --root
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
            pass
    except OSError as e:
        reason = "a file, not a folder" if os.path.isfile(root) else (e.strerror or type(e).__name__).lower()
        raise ConfigError(f"--root {root}: cannot write there ({reason}); give a folder you can write to") from None
    try:
        run_store.check_store_file(config.metadata_path)
    except run_store.NoMetadata as e:
        raise ConfigError(str(e)) from None


def check_schema(path: str) -> None:
    """A curated schema must parse before anything runs (not after ingestion, as ImportSchemaGen would)."""
    fix = "give a schema.pbtxt ('imagepipe export-schema' writes one), or leave --schema out to infer one"
    try:
        with open(path, encoding="utf-8") as f:
            schema = text_format.Parse(f.read(), schema_pb2.Schema())
    except UnicodeDecodeError:
        raise ConfigError(f"--schema {path}: not a text file; {fix}") from None
    except text_format.ParseError as e:
        raise ConfigError(f"--schema {path}: not a TFDV schema ({e}); {fix}") from None
    except OSError as e:
        raise ConfigError(f"--schema {path}: cannot read it ({e.strerror}); {fix}") from None
    if not schema.feature:
        raise ConfigError(f"--schema {path}: a schema with no features; {fix}")


def with_earlier_search(config: PipelineConfig) -> PipelineConfig:
    """A run without --tune of a pipeline that searched before keeps its tuned training: the Tuner step runs
    with the last search's trial count and reuses its best values unless the data or settings moved
    (components/tuner/decision.py). --retune (tune_mode "search") searches again with that count."""
    if config.tune_trials:
        return config

    from runs import run_store  # ML Metadata (~0.2 s): only a run without --tune reads the last search

    trials = 0
    if os.path.exists(config.metadata_path):
        store = run_store.open_store(config.metadata_path)
        # The newest that holds a search (a Tuner that failed before writing one left an empty artifact).
        for found in sorted(store.get_artifacts_by_type("TunerResults"), key=lambda a: -a.id):
            path = os.path.join(relocate(found.uri, config.pipeline_root), SEARCH_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    trials = int(json.load(f).get("trials") or 0)
                break
    if trials:
        return dataclasses.replace(config, tune_trials=trials)
    if config.tune_mode == "search":
        raise ConfigError(f"--retune: pipeline {config.pipeline_name!r} has not searched yet; give --tune N (trials)")
    return config


def prepare(config: PipelineConfig) -> Prepared:
    """Checks the settings once, makes the sample data if it is the input, then checks the input (see preflight)
    and --root, and settles the run's model and search.

    Bad input is reported before anything is written: --root is made (and checked) after the data
    checks, or first when the data is the sample, which is written under it.
    """
    config.validate()
    if config.uses_sample_data:
        check_root(config)
        sample_data.make_digits(config.sample_data_dir, "the sample data folder (under --root)")
        prepared = preflight(config)
    else:
        prepared = preflight(config)
        check_root_outside_data(config)
        check_root(config)
    return prepared._replace(config=with_earlier_search(prepared.config))
