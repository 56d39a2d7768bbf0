# The pipeline image: every component runs in it on Vertex AI / Kubeflow (and Dataflow workers
# and Vertex AI Training jobs use it too), so components.*, trainer.* and schemas/ are there.
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/imagepipe/pipeline:TAG .
#
# Its TPU build, for the Trainer on a TPU (--training-tpu with --training-image), on the legacy stack:
#
#   docker build --build-arg STACK=legacy --build-arg ACCELERATOR=tpu -t .../imagepipe/pipeline-tpu:TAG .
#
# STACK=modern (the default): Python 3.13 on Debian 13 (glibc 2.41; TFX 1.21's TFDV and ML Metadata need 2.39+) with
# stacks/modern.lock. STACK=legacy: the TFX 1.16 image with stacks/legacy.lock (--build-arg STACK=legacy). The image
# is named the same either way: compiled Vertex and Kubeflow jobs only name it.
ARG STACK=modern
FROM python:3.13-slim-trixie AS modern-base
# pyfarmhash (TFDV's) builds from source on Python 3.13: a compiler for the install, removed after it.
ENV BUILD_TOOLS="g++"
FROM tensorflow/tfx:1.16.0 AS legacy-base
ENV BUILD_TOOLS=""

FROM ${STACK}-base
ARG STACK=modern
WORKDIR /pipeline
COPY stacks/${STACK}.lock pyproject.toml ./
RUN if [ -n "$BUILD_TOOLS" ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends $BUILD_TOOLS; fi \
 && python -m pip install --no-cache-dir uv==0.13.9 \
 && uv pip install --system --no-cache --compile-bytecode -r ${STACK}.lock \
 && if [ -n "$BUILD_TOOLS" ]; then apt-get purge -y -qq --auto-remove $BUILD_TOOLS && rm -rf /var/lib/apt/lists/*; fi

# ACCELERATOR=tpu: TensorFlow's TPU build of the lock's version in place of the plain one (the same modules,
# and libtpu to drive the chips), pinned to the libtpu that build was made against. tensorflow-tpu 2.16.x
# requires libtpu==2.16.0rc0, which PyPI does not have: Google publishes it on its libtpu-releases index
# (what TensorFlow's install guide gives, `pip install tensorflow-tpu -f .../libtpu-releases/index.html`).
# Without them a TPU job cannot reach its TPU (trainer/strategy.py then stops the Trainer). TensorFlow has no TPU
# build of 2.21 (tensorflow-tpu stops at 2.20), so the TPU image is the legacy stack's.
ARG ACCELERATOR=cpu
ARG TPU_TENSORFLOW=tensorflow-tpu==2.16.2
ARG LIBTPU=libtpu==2.16.0rc0
ARG LIBTPU_INDEX=https://storage.googleapis.com/libtpu-releases/index.html
RUN if [ "$ACCELERATOR" = "tpu" ] && [ "$STACK" != "legacy" ]; then \
      echo "ACCELERATOR=tpu: TensorFlow publishes no TPU build of 2.21 (tensorflow-tpu stops at 2.20); add --build-arg STACK=legacy" && exit 1; \
    elif [ "$ACCELERATOR" = "tpu" ]; then \
      uv pip uninstall --system tensorflow \
   && uv pip install --system --no-cache --no-deps "$TPU_TENSORFLOW" "$LIBTPU" --find-links "$LIBTPU_INDEX" \
   && python -c 'import libtpu, tensorflow; print("TensorFlow", tensorflow.__version__, "TPU build")'; \
    elif [ "$ACCELERATOR" != "cpu" ]; then echo "ACCELERATOR=$ACCELERATOR: use cpu or tpu" && exit 1; fi

# The project itself, referenced by module path (components.example_gen.executor.Executor,
# trainer.task.run_fn, components.transform.preprocessing.preprocessing_fn), not as wheels made at compile time.
COPY . .
RUN uv pip install --system --no-cache --no-deps . \
 && python -c "import components.beam_settings, components.example_gen.executor, \
      components.example_gen.vertex_driver, components.validation.statistics, components.validation.gate, \
      components.transform.executor, components.transform.preprocessing, components.features.executor, \
      components.health.executor, components.health.gate, components.tuner.executor, \
      components.trainer.component, components.evaluator.executor, components.model_card.executor, \
      components.pusher.component, pipeline.run_check, trainer.task, trainer.search, pipeline.pipeline"
ENV PYTHONPATH=/pipeline
