"""create_pipeline(): the one TFX DAG, shared by every runner (local, Kubeflow, Vertex).

  ImageExampleGen -> StatisticsGen -> SchemaGen | ImportSchemaGen -> ExampleValidator -> DataValidationGate
    -> Transform -> [BackboneFeatures: transfer models] -> DataHealth -> DataHealthGate -> [Tuner: --tune N]
    -> Trainer -> Evaluator (vs the latest blessed model) -> ModelCard -> Pusher (when blessed, with the card)

Transform runs after the gate, so nothing consumes data that failed validation. On Vertex AI and Kubeflow
the settings of RUNTIME_PARAMETERS are pipeline parameters: a run of the compiled job can change them.
"""

import dataclasses
import json

from kfp.pipeline_spec import pipeline_spec_pb2
from tfx import v1 as tfx

from components.beam_settings import with_executor
from components.evaluator import Blessing
from components.evaluator.component import ImageEvaluator
from components.evaluator.eval_config import eval_config
from components.example_gen.component import ImageExampleGen
from components.example_gen.ingest_defaults import PARAMETERS
from components.features.component import BackboneFeatures
from components.health.component import DataHealth
from components.health.gate import DataHealthGate
from components.model_card.component import ModelCard
from components.pusher.component import ImagePusher
from components.trainer.component import TRAINER_SETTINGS, ImageTrainer
from components.transform.executor import TransformExecutor
from components.tuner import Search
from components.tuner.component import ImageTuner, LatestSearch
from components.tuner.executor import LIMITS as TUNER_LIMITS
from components.validation.gate import DataValidationGate
from components.validation.statistics import StatisticsGenExecutor, stats_options
from pipeline.config import PipelineConfig
from pipeline.pipeline_inputs import example_gen_base, example_gen_input, example_gen_output, review_file
from pipeline.platform import Platform
from pipeline.run_check import RunCheck
from pipeline.runtime_parameters import RUNTIME_PARAMETERS, job_has_parameter, job_parameters
from settings import declared
from trainer.hparams import AUTO


def create_pipeline(config: PipelineConfig, platform: Platform, metadata_connection_config=None) -> tfx.dsl.Pipeline:
    """The DAG for `config`, on the runner's `platform` (pipeline/platform.py: local, or
    kubeflow/cloud_platform.py for Vertex AI and Kubeflow Pipelines): the stages in their order."""
    dag = _Stages(config, platform)
    check = dag.run_check()
    example_gen = dag.example_gen(check)
    statistics_gen, schema_gen, example_validator = dag.validation(example_gen, check)
    baseline = dag.latest_blessed_model()
    gate = dag.validation_gate(example_gen, example_validator, baseline)
    transform = dag.transform(example_gen, schema_gen, gate)
    features = dag.features(transform)
    health, health_gate = dag.health(example_gen, transform, features, baseline)
    # What the Trainer (and the Tuner) train on: a transfer model's head on the cached features, else pixels.
    training_examples = features.outputs["features"] if features else transform.outputs["transformed_examples"]
    previous_search, tuner = dag.tuner(example_gen, transform, training_examples, health_gate)
    trainer = dag.trainer(transform, schema_gen, training_examples, baseline, tuner, health_gate)
    evaluator = dag.evaluator(example_gen, trainer, baseline, features)
    card = dag.model_card(example_gen, health, trainer, evaluator, baseline)
    pusher = dag.pusher(trainer, evaluator, card)
    components = [
        check,
        example_gen,
        statistics_gen,
        schema_gen,
        example_validator,
        baseline,
        gate,
        transform,
        features,
        health,
        health_gate,
        previous_search,
        tuner,
        trainer,
        evaluator,
        card,
        pusher,
    ]
    dag.size_steps([c for c in components if c is not None])
    return tfx.dsl.Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=platform.pipeline_root,
        components=[c for c in components if c is not None],
        enable_cache=config.enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=platform.beam_pipeline_args,
    )


class _Stages:
    """Each stage of the DAG made from the configuration, on the platform; a stage that does not run is None."""

    def __init__(self, config: PipelineConfig, platform: Platform):
        if config.model == AUTO:  # a runner resolves it first (pipeline/model_choice.py): Transform's size follows
            raise ValueError("create_pipeline: --model auto is chosen by the runner from the images first")
        self.config, self.platform = config, platform
        self.hp = config.hparams()
        self.hparams = self.hp.to_custom_config()  # the Tuner's and the Trainer's custom_config

    def size_steps(self, components) -> None:
        """A compiled job's machine for each step (ImageExampleGen's is set in its executor spec by
        kubeflow/deploy.py: TFX's compiler leaves an ExampleGen's out), and Beam options of a step's own."""
        resources = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec
        for component in components:
            machine = self.platform.step_machines.get(component.id)
            if machine is not None:
                spec = resources(cpu_limit=machine.cpus, memory_limit=machine.memory_gb)
                if machine.accelerator:
                    spec.accelerator.type, spec.accelerator.count = machine.accelerator, machine.accelerator_count
                component.with_platform_config(spec)
            if self.platform.step_beam_args.get(component.id):
                component.with_beam_pipeline_args(self.platform.step_beam_args[component.id])

    def setting(self, name: str):
        """A setting's value, or on a platform that takes them, the runtime parameter that defaults to it (for the
        settings declared `runtime`)."""
        value = getattr(self.config, name)
        if name not in RUNTIME_PARAMETERS or not self.platform.compiled or not job_has_parameter(self.config, name):
            return value
        ptype = RUNTIME_PARAMETERS[name]
        return tfx.dsl.experimental.RuntimeParameter(name=name, ptype=ptype, default=ptype(value))

    def run_check(self):
        """A compiled job checks its runtime parameters and the account it runs as before anything else
        (pipeline/run_check.py): a run started with `tfx run create` sends both unchecked."""
        if not self.platform.compiled:
            return None

        names = job_parameters(self.config)
        return RunCheck(
            **{name: self.setting(name) for name in names},
            job_parameters=",".join(names),
            service_account=self.platform.service_account,
        )

    def example_gen(self, check):
        config = self.config
        # every declared ingestion parameter (ingest_defaults.PARAMETERS); those declared `runtime` (span_window) as
        # runtime parameters of a compiled job
        settings = {f.name: self.setting(f.name) for f in PARAMETERS}
        example_gen = ImageExampleGen(
            input_base=example_gen_base(config),
            input_config=example_gen_input(config),
            output_config=example_gen_output(config),
            seed=config.seed,
            **{**settings, "review": review_file(config)},
        )
        if check is not None:
            example_gen.add_upstream_node(check)
        return example_gen

    def validation(self, example_gen, check):
        """StatisticsGen, the schema (curated: ImportSchemaGen; else SchemaGen infers it), ExampleValidator.

        StatisticsGen (like Transform and the Evaluator) batches by bytes and checks TFRecord checksums fast
        (components/beam_settings.py): a batch of full-size photos weighs what a batch of thumbnails does."""
        statistics_gen = with_executor(
            tfx.components.StatisticsGen(examples=example_gen.outputs["examples"], stats_options=stats_options()),
            StatisticsGenExecutor,
        )
        if self.platform.schema_file:
            schema_gen = tfx.components.ImportSchemaGen(schema_file=self.platform.schema_file)
            if check is not None:  # the other task with no input: it too waits for the check
                schema_gen.add_upstream_node(check)
        else:
            schema_gen = tfx.components.SchemaGen(
                statistics=statistics_gen.outputs["statistics"], infer_feature_shape=True
            )
        example_validator = tfx.components.ExampleValidator(
            statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
        )
        return statistics_gen, schema_gen, example_validator

    def latest_blessed_model(self):
        """The latest blessed model: the Evaluator's baseline, the Trainer's warm start, and (through its
        blessing, which keeps the profile of its data) the gate's drift reference. Kubeflow Pipelines'
        open-source backend has no resolver executor, so there the threshold alone gates, without drift."""
        if not self.platform.runs_resolvers:
            return None
        return tfx.dsl.Resolver(
            strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
            model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
            model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
        ).with_id("latest_blessed_model_resolver")

    def validation_gate(self, example_gen, example_validator, baseline):
        return DataValidationGate(
            anomalies=example_validator.outputs["anomalies"],
            examples=example_gen.outputs["examples"],
            baseline_blessing=baseline.outputs["model_blessing"] if baseline else None,
            fail_on_anomalies=(self.config.gate == "fail"),
            drift_thresholds=json.dumps(dataclasses.asdict(self.config.drift_thresholds()), sort_keys=True),
        )

    def transform(self, example_gen, schema_gen, gate):
        transform = with_executor(
            tfx.components.Transform(
                examples=example_gen.outputs["examples"],
                schema=schema_gen.outputs["schema"],
                preprocessing_fn="components.transform.preprocessing.preprocessing_fn",
                # only what preprocessing_fn reads: a change of a training setting keeps Transform's cached output
                custom_config=self.hp.transform_config(),
                splits_config=tfx.proto.SplitsConfig(analyze=["train"], transform=["train", "eval"]),
                # Transform's own pre-transform statistics would be a second StatisticsGen pass over
                # every encoded image (its post-transform ones describe serialized pixel tensors);
                # nothing reads either, so they are skipped.
                disable_statistics=True,
            ),
            TransformExecutor,
        )
        transform.add_upstream_node(gate)  # the gate must pass before any data is consumed
        return transform

    def features(self, transform):
        """Transfer models: the frozen backbone runs once per image (cached across runs), and the Trainer's
        frozen phase trains the head on its output (components/features)."""
        if self.hp.model == "cnn":
            return None
        return BackboneFeatures(
            transformed_examples=transform.outputs["transformed_examples"],
            hparams=self.hp.features_config(),
            cache_dir=self.platform.feature_cache,
        )

    def health(self, example_gen, transform, features, baseline):
        """Likely label errors, outliers, near-duplicates and drift in feature space, before any training
        (components/health): over a limit it stops the run, as the gate does (or warns)."""
        health = DataHealth(
            ingestion_report=example_gen.outputs["report"],
            transformed_examples=transform.outputs["transformed_examples"],
            transform_graph=transform.outputs["transform_graph"],
            features=features.outputs["features"] if features else None,
            baseline_model=baseline.outputs["model"] if baseline and features else None,  # feature drift only
            hparams=self.hp.health_config(),
            label_check=self.config.label_check,
            limits=self.config.health_limits(),
        )
        gate = DataHealthGate(health=health.outputs["health"], fail_on_problems=(self.config.gate == "fail"))
        return health, gate

    def tuner(self, example_gen, transform, training_examples, health_gate):
        """--tune N: KerasTuner trials (trainer/search.py) on what the Trainer trains on; a run searches again
        only when the data or settings moved since the last search (components/tuner/decision.py), found by
        the resolver, unless asked to (tune_mode "search")."""
        config, platform = self.config, self.platform
        if config.tune_trials <= 0:
            return None, None
        previous_search = None
        if platform.runs_resolvers:
            previous_search = tfx.dsl.Resolver(
                # Vertex's compiler knows TFX's strategies only (components/tuner/component.py)
                strategy_class=tfx.dsl.experimental.LatestArtifactStrategy if platform.compiled else LatestSearch,
                tuner_results=tfx.dsl.Channel(type=tfx.types.standard_artifacts.TunerResults),
            ).with_id("latest_search_resolver")
        tuner = ImageTuner(
            examples=training_examples,
            transform_graph=transform.outputs["transform_graph"],
            ingestion_report=example_gen.outputs["report"],
            hparams=self.hparams,
            previous=previous_search.outputs["tuner_results"] if previous_search else None,
            vertex=platform.vertex_tuning_config,
            parallel_trials=platform.parallel_trials,
            # each declared search setting (a runtime parameter where declared so), and what the decision reads
            **{f.name: self.setting(f.name) for f in declared(Search)},
            **{limit: getattr(config, limit) for limit in TUNER_LIMITS},
            epochs=self.setting("epochs"),
            pipeline=config.pipeline_name,
        ).with_id("Tuner")
        tuner.add_upstream_node(health_gate)  # no search on data that failed its health check
        return previous_search, tuner

    def trainer(self, transform, schema_gen, training_examples, baseline, tuner, health_gate):
        platform = self.platform
        trainer = ImageTrainer(
            examples=training_examples,
            transform_graph=transform.outputs["transform_graph"],
            schema=schema_gen.outputs["schema"],
            base_model=baseline.outputs["model"] if self.config.warm_start and baseline else None,
            hyperparameters=tuner.outputs["best_hyperparameters"] if tuner else None,
            custom_config={**self.hparams, **(platform.vertex_training_config or {})},
            settings={name: self.setting(name) for name in TRAINER_SETTINGS} if platform.compiled else {},
            vertex=bool(platform.vertex_training_config),
        ).with_id("Trainer")
        trainer.add_upstream_node(health_gate)  # no training on data that failed its health check
        return trainer

    def evaluator(self, example_gen, trainer, baseline, features):
        config = self.config
        return ImageEvaluator(
            examples=example_gen.outputs["examples"],
            features=features.outputs["features"] if features else None,  # the heads scored on it, where they agree
            model=trainer.outputs["model"],
            baseline_model=baseline.outputs["model"] if baseline else None,
            eval_config=eval_config(config.accuracy_threshold, config.confidence_threshold),
            example_splits=["eval"],
            # each declared blessing setting (components/evaluator Blessing); locally eval_config carries the
            # accuracy threshold, a compiled job's runs may change it
            settings={
                f.name: self.setting(f.name)
                for f in declared(Blessing)
                if self.platform.compiled or f.name != "accuracy_threshold"
            },
        ).with_id("Evaluator")

    def model_card(self, example_gen, health, trainer, evaluator, baseline):
        """The model's card, from ML Metadata and the artifacts (components/model_card), with the confidence
        threshold the Evaluator chose; pushed beside the model."""
        return ModelCard(
            trainer,
            evaluator,
            example_gen,
            health=health.outputs["health"],
            baseline_model=baseline.outputs["model"] if baseline else None,
            pipeline=self.config.pipeline_name,
        )

    def pusher(self, trainer, evaluator, card):
        if self.platform.vertex_serving_config:
            return tfx.extensions.google_cloud_ai_platform.Pusher(
                model=trainer.outputs["model"],
                model_blessing=evaluator.outputs["blessing"],
                custom_config=self.platform.vertex_serving_config,
            )
        return ImagePusher(
            model=trainer.outputs["model"],
            model_blessing=evaluator.outputs["blessing"],
            model_card=card.outputs["model_card"],
            push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(base_directory=self.platform.serving_dir)
            ),
        ).with_id("Pusher")
