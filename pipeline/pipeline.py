"""create_pipeline(): the one TFX DAG, shared by every runner (local, Kubeflow, Vertex).

  ImageExampleGen -> StatisticsGen -> SchemaGen | ImportSchemaGen -> ExampleValidator -> DataValidationGate
    -> Transform -> [BackboneFeatures: transfer models] -> DataHealth -> DataHealthGate -> [Tuner: --tune N]
    -> Trainer -> Evaluator (vs the latest blessed model) -> ModelCard -> Pusher (when blessed, with the card)

Transform runs after the gate, so nothing consumes data that failed validation. On Vertex AI and Kubeflow
the settings of RUNTIME_PARAMETERS are pipeline parameters: a run of the compiled job can change them.
"""

from tfx import v1 as tfx

from components.beam_settings import tuned
from components.evaluator.component import ImageEvaluator
from components.evaluator.eval_config import eval_config
from components.example_gen.component import ImageExampleGen
from components.features.component import BackboneFeatures
from components.health.component import DataHealth
from components.health.gate import DataHealthGate
from components.model_card.component import ModelCard
from components.pusher.component import ImagePusher
from components.trainer.component import TRAINER_SETTINGS, ImageTrainer
from components.transform.executor import TransformExecutor
from components.tuner.component import ImageTuner, LatestSearch
from components.validation.gate import DataValidationGate
from components.validation.statistics import StatisticsGenExecutor, stats_options
from pipeline.config import RUNTIME_PARAMETERS, PipelineConfig, job_has_parameter
from pipeline.platform import Platform
from pipeline.pipeline_inputs import example_gen_base, example_gen_input, example_gen_output


def create_pipeline(config: PipelineConfig, platform: Platform, metadata_connection_config=None) -> tfx.dsl.Pipeline:
    """The DAG for `config`, on the runner's `platform` (pipeline/platform.py: local, or
    kubeflow/cloud_platform.py for Vertex AI and Kubeflow Pipelines)."""

    def setting(name: str):
        """A setting's value, or on a platform that takes them, the runtime parameter that defaults to it."""
        field, ptype = RUNTIME_PARAMETERS[name]
        value = getattr(config, field)
        if not platform.compiled or not job_has_parameter(config, name):
            return value
        return tfx.dsl.experimental.RuntimeParameter(name=name, ptype=ptype, default=ptype(value))

    # A compiled job checks its runtime parameters and the account it runs as before anything else
    # (pipeline/run_check.py): a run started with `tfx run create` sends both unchecked.
    check = None
    if platform.compiled:
        from pipeline.run_check import RunCheck

        names = [name for name in RUNTIME_PARAMETERS if job_has_parameter(config, name)]
        check = RunCheck(**{name: setting(name) for name in names}, job_parameters=",".join(names),
                         service_account=platform.service_account)
    example_gen = ImageExampleGen(
        input_base=example_gen_base(config),
        input_config=example_gen_input(config),
        output_config=example_gen_output(config),
        layout=config.layout,
        max_pixels=config.max_pixels,
        max_bad_fraction=config.max_bad_fraction,
        drop_duplicates=config.drop_duplicates,
        compression_level=config.compression_level,
        span_window=setting("span_window"),
        store_max_pixels=config.store_max_pixels,
        seed=config.seed,
        near_duplicates=config.near_duplicates,
        task=config.task)
    if check is not None:
        example_gen.add_upstream_node(check)

    # StatisticsGen, Transform and the Evaluator batch by bytes and check TFRecord checksums fast
    # (components/beam_settings.py): a batch of full-size photos weighs what a batch of thumbnails does.
    statistics_gen = tuned(tfx.components.StatisticsGen(
        examples=example_gen.outputs["examples"], stats_options=stats_options()),
        StatisticsGenExecutor)

    if platform.schema_file:
        schema_gen = tfx.components.ImportSchemaGen(schema_file=platform.schema_file)
        if check is not None:  # the other task with no input: it too waits for the check
            schema_gen.add_upstream_node(check)
    else:
        schema_gen = tfx.components.SchemaGen(
            statistics=statistics_gen.outputs["statistics"], infer_feature_shape=True)

    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])

    # The latest blessed model: the Evaluator's baseline, the Trainer's warm start, and (through its
    # blessing, which keeps the profile of its data) the gate's drift reference. Kubeflow Pipelines'
    # open-source backend has no resolver executor, so there the threshold alone gates, without drift.
    baseline = None
    if platform.runs_resolvers:
        baseline = tfx.dsl.Resolver(
            strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
            model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
            model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
        ).with_id("latest_blessed_model_resolver")

    gate = DataValidationGate(
        anomalies=example_validator.outputs["anomalies"],
        examples=example_gen.outputs["examples"],
        baseline_blessing=baseline.outputs["model_blessing"] if baseline else None,
        fail_on_anomalies=(config.gate == "fail"),
        **config.drift_thresholds()._asdict())

    hp = config.hparams()
    hparams = hp.to_custom_config()
    transform = tuned(tfx.components.Transform(
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        preprocessing_fn="components.transform.preprocessing.preprocessing_fn",
        custom_config=hp.transform_config(),  # only what preprocessing_fn reads: training settings keep its cache
        splits_config=tfx.proto.SplitsConfig(analyze=["train"], transform=["train", "eval"]),
        # Transform's own pre-transform statistics would be a second StatisticsGen pass over
        # every encoded image (its post-transform ones describe serialized pixel tensors);
        # nothing reads either, so they are skipped.
        disable_statistics=True), TransformExecutor)
    transform.add_upstream_node(gate)  # the gate must pass before any data is consumed

    # Transfer models: the frozen backbone runs once per image (cached across runs), and the Trainer's
    # frozen phase trains the head on its output (components/features).
    features = None
    if hp.model != "cnn":
        features = BackboneFeatures(transformed_examples=transform.outputs["transformed_examples"],
                                    hparams=hp.features_config(), cache_dir=platform.feature_cache)
    # Likely label errors, outliers, near-duplicates and drift in feature space, before any training
    # (components/health): over a limit it stops the run, as the gate does (or warns).
    health = DataHealth(
        ingestion_report=example_gen.outputs["report"], transformed_examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        features=features.outputs["features"] if features else None,
        baseline_model=baseline.outputs["model"] if baseline and features else None,  # feature drift only
        hparams=hp.health_config(), label_check=config.label_check, **config.health_limits()._asdict())
    health_gate = DataHealthGate(health=health.outputs["health"], fail_on_problems=(config.gate == "fail"))
    training_examples = features.outputs["features"] if features else transform.outputs["transformed_examples"]

    # --tune N: KerasTuner trials (trainer/search.py) on what the Trainer trains on (a transfer model's head on
    # the cached features); a run searches again only when the data or settings moved since the last search
    # (components/tuner/decision.py), found by the resolver, unless asked to (tune_mode "search").
    tuner, previous_search = None, None
    if config.tune > 0:
        if platform.runs_resolvers:
            previous_search = tfx.dsl.Resolver(
                # Vertex's compiler knows TFX's strategies only (components/tuner/component.py)
                strategy_class=tfx.dsl.experimental.LatestArtifactStrategy if platform.compiled else LatestSearch,
                tuner_results=tfx.dsl.Channel(type=tfx.types.standard_artifacts.TunerResults),
            ).with_id("latest_search_resolver")
        tuner = ImageTuner(
            examples=training_examples, transform_graph=transform.outputs["transform_graph"],
            ingestion_report=example_gen.outputs["report"],
            previous=previous_search.outputs["tuner_results"] if previous_search else None,
            trials=setting("tune_trials"), mode=config.tune_mode, pipeline=config.pipeline_name, hparams=hparams,
            max_class_drift=config.max_class_drift, max_feature_drift=config.max_feature_drift,
            vertex=platform.vertex_tuning_config, parallel_trials=platform.parallel_trials,
            epochs=setting("epochs")).with_id("Tuner")
        tuner.add_upstream_node(health_gate)  # no search on data that failed its health check

    trainer = ImageTrainer(
        run_fn="trainer.task.run_fn", examples=training_examples,
        transform_graph=transform.outputs["transform_graph"], schema=schema_gen.outputs["schema"],
        base_model=baseline.outputs["model"] if config.warm_start and baseline else None,
        hyperparameters=tuner.outputs["best_hyperparameters"] if tuner else None,
        custom_config={**hparams, **(platform.vertex_training_config or {})},
        settings={name: setting(name) for name in TRAINER_SETTINGS} if platform.compiled else {},
        vertex=bool(platform.vertex_training_config)).with_id("Trainer")
    trainer.add_upstream_node(health_gate)  # no training on data that failed its health check

    evaluator = ImageEvaluator(
        examples=example_gen.outputs["examples"],
        model=trainer.outputs["model"],
        baseline_model=baseline.outputs["model"] if baseline else None,
        eval_config=eval_config(config.accuracy_threshold, config.confidence_threshold),
        example_splits=["eval"],
        settings={**({"accuracy_threshold": setting("accuracy_threshold")} if platform.compiled else {}),
                  # every class with enough eval images must reach it (components/evaluator/metrics.py)
                  "min_class_recall": setting("min_class_recall"),
                  "confidence_threshold": config.confidence_threshold, "target_precision": config.target_precision,
                  # eval images whose maps the report shows (components/evaluator/explanations.py)
                  "explanations": config.explanations},
    ).with_id("Evaluator")

    # The model's card, from ML Metadata and the artifacts (components/model_card), with the confidence
    # threshold the Evaluator chose; pushed beside the model.
    card = ModelCard(model=trainer.outputs["model"], model_run=trainer.outputs["model_run"],
                     evaluation=evaluator.outputs["evaluation"], blessing=evaluator.outputs["blessing"],
                     examples=example_gen.outputs["examples"], ingestion_report=example_gen.outputs["report"],
                     health=health.outputs["health"], baseline_model=baseline.outputs["model"] if baseline else None,
                     pipeline=config.pipeline_name)

    if platform.vertex_serving_config:
        pusher = tfx.extensions.google_cloud_ai_platform.Pusher(
            model=trainer.outputs["model"], model_blessing=evaluator.outputs["blessing"],
            custom_config=platform.vertex_serving_config)
    else:
        pusher = ImagePusher(
            model=trainer.outputs["model"],
            model_blessing=evaluator.outputs["blessing"],
            model_card=card.outputs["model_card"],
            push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(base_directory=platform.serving_dir))).with_id("Pusher")

    components = [check, example_gen, statistics_gen, schema_gen, example_validator, baseline, gate,
                  transform, features, health, health_gate, previous_search, tuner, trainer, evaluator, card, pusher]
    components = [c for c in components if c is not None]
    return tfx.dsl.Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=platform.pipeline_root,
        components=components,
        enable_cache=config.enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=platform.beam_pipeline_args)
