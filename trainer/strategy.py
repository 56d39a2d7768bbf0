"""Picks the distribution strategy at run time: several machines, a TPU, several GPUs, one GPU, else the CPU.

The same run_fn trains on a laptop, a multi-GPU VM, a TPU VM and several machines of Vertex AI Training
without a flag:
  - several machines: TF_CONFIG names a cluster of more than one chief/worker task (Vertex AI Training sets it
    on each replica of a job with worker pools: --training-replicas) -> MultiWorkerMirroredStrategy;
  - a TPU: a TPU is attached (TPU_NAME, /dev/accel*) -> TPUStrategy. One that was asked for (--training-tpu)
    and cannot be reached stops the Trainer (TrainingDeviceError), instead of training on the TPU VM's CPU;
  - several GPUs -> MirroredStrategy; one GPU -> OneDeviceStrategy;
  - the CPU, or several logical CPU devices (split_cpu: tests, and `imagepipe run --cpu-replicas N`, run the
    multi-replica code for real without accelerators) -> MirroredStrategy over them.
Mixed precision follows the device (--mixed-precision auto): bfloat16 on TPU, float16 on GPU, none on CPU;
`on` asks for it anyway (bfloat16 on a CPU), `off` never.

plan() decides from what the machine has (tests pass fakes); make() builds it.
"""

import contextlib
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

import keras
import tensorflow as tf
from absl import logging

# Signs of a TPU: without one, TPUClusterResolver() asks the GCE metadata server, which
# hangs or fails slowly off Google Cloud, so it is only asked when a TPU may be there.
_TPU_ENV = ("TPU_NAME", "TPU_ADDRESS", "COLAB_TPU_ADDR", "TPU_WORKER_HOSTNAMES")
# The TF_CONFIG task types that train (an "evaluator" or "ps" task is not a replica).
_TRAINING_TASKS = ("chief", "worker")


class TrainingDeviceError(RuntimeError):
    """The device training was asked to use is not there (one line: what was asked, what was found)."""


@dataclass
class Plan:
    kind: str  # "multi-worker", "tpu", "multi-gpu", "gpu", "multi-cpu" or "cpu"
    devices: List[str]
    mixed_precision_policy: Optional[str]  # a Keras policy name, or None for float32
    tpu_resolver: object = None
    # multi-worker: TF_CONFIG's cluster ({"chief": [...], "worker": [...]}) and this process's task.
    cluster: Dict[str, List[str]] = field(default_factory=dict)
    task: Dict[str, object] = field(default_factory=dict)

    def describe(self, replicas: int) -> str:
        policy = self.mixed_precision_policy or "float32"
        return f"{self.kind} ({replicas} replica{'s' if replicas > 1 else ''}: {', '.join(self.devices)}), {policy}"

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the model, the logs and training.json: always, but in a multi-worker
        cluster, where only the chief does (the "chief" task, else worker 0: TensorFlow's convention)."""
        if self.kind != "multi-worker":
            return True
        kind, index = self.task.get("type"), int(self.task.get("index", 0))
        return kind == "chief" or (kind == "worker" and index == 0 and not self.cluster.get("chief"))

    @property
    def workers(self) -> int:
        """The machines that train together: TF_CONFIG's chief and workers, or 1."""
        return sum(len(self.cluster.get(k, [])) for k in _TRAINING_TASKS) or 1

    @property
    def static_shapes(self) -> bool:
        """Whether every batch must have one shape: XLA on TPU compiles one, and MirroredStrategy splits a short last
        batch unevenly over its replicas, which Keras 3 then fails to add up (--cpu-replicas 3 on 80 eval images:
        "AddN ... [27,1280] != [26,1280]"). Eval batches are padded with weightless examples, so figures stay exact."""
        return self.kind in ("tpu", "multi-cpu", "multi-gpu")


def tpu_may_exist(environ: Mapping[str, str] = os.environ) -> bool:
    return any(environ.get(k) for k in _TPU_ENV) or bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def connect_tpu():
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return resolver


def training_cluster(environ: Mapping[str, str] = os.environ) -> Optional[dict]:
    """TF_CONFIG when it names more than one training task ({"cluster": ..., "task": ...}), else None."""
    raw = environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        cluster = {k: list(v) for k, v in (config.get("cluster") or {}).items()}
        task = dict(config.get("task") or {})
    except (ValueError, AttributeError, TypeError) as e:
        raise TrainingDeviceError(
            f"TF_CONFIG is not a cluster spec ({e}): it must be JSON with 'cluster' and "
            "'task', as Vertex AI Training sets it"
        ) from None
    if sum(len(cluster.get(k, [])) for k in _TRAINING_TASKS) <= 1:
        return None  # one machine (Vertex sets TF_CONFIG on a one-replica job too)
    if task.get("type") not in _TRAINING_TASKS:
        raise TrainingDeviceError(f"TF_CONFIG task {task!r}: this process must be a chief or a worker of the cluster")
    return {"cluster": cluster, "task": task}


def plan(
    mixed_precision: str = "auto",
    tpu_resolver: Optional[Callable[[], object]] = None,
    gpus: Optional[List[str]] = None,
    cpus: Optional[List[str]] = None,
    environ: Optional[Mapping[str, str]] = None,
    required: str = "",
) -> Plan:
    """The best plan for this machine.

    `tpu_resolver` (returns a connected resolver or raises), `gpus`, `cpus` and `environ` default to probing
    the machine. `required` "tpu": a TPU was asked for, and its absence is a TrainingDeviceError.
    """
    environ = os.environ if environ is None else environ
    multi_worker = training_cluster(environ)
    if multi_worker and required != "tpu":
        # Physical devices only: MultiWorkerMirroredStrategy must be made before TensorFlow's runtime starts
        # ("Collective ops must be configured at program startup"), and listing logical devices starts it.
        if gpus is None:
            gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
        workers = sum(len(multi_worker["cluster"].get(k, [])) for k in _TRAINING_TASKS)
        accelerated = "mixed_float16" if gpus else None
        return Plan(
            "multi-worker",
            [f"{workers} machines", f"{max(1, len(gpus))} {'GPU' if gpus else 'CPU'} each"],
            _policy(mixed_precision, accelerated),
            cluster=multi_worker["cluster"],
            task=multi_worker["task"],
        )
    if gpus is None:
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if tpu_resolver is None and (required == "tpu" or tpu_may_exist(environ)):
        tpu_resolver = connect_tpu
    if tpu_resolver is not None:
        try:
            resolver = tpu_resolver()
        except (ValueError, RuntimeError, OSError, tf.errors.OpError) as e:  # OSError: a TPU_NAME that does not answer
            reason = " ".join(str(e).split())[:300] or type(e).__name__
            if required == "tpu":
                raise TrainingDeviceError(
                    f"--training-tpu: no TPU reachable (TPU_NAME={environ.get('TPU_NAME', 'local')}: {reason}); the "
                    "Trainer does not fall back to the CPU. Is the job's image the TPU build (the Dockerfile, "
                    "--build-arg ACCELERATOR=tpu)?"
                ) from None
            logging.warning("No usable TPU (%s); looking for GPUs", reason)
        else:
            return Plan("tpu", ["TPU"], _policy(mixed_precision, "mixed_bfloat16"), resolver)
    if len(gpus) > 1:
        return Plan("multi-gpu", list(gpus), _policy(mixed_precision, "mixed_float16"))
    if len(gpus) == 1:
        return Plan("gpu", list(gpus), _policy(mixed_precision, "mixed_float16"))
    if cpus is None:
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(cpus) > 1:
        return Plan("multi-cpu", list(cpus), _policy(mixed_precision, None))
    return Plan("cpu", ["CPU"], _policy(mixed_precision, None))


def make(chosen: Plan) -> tf.distribute.Strategy:
    if chosen.kind == "multi-worker":
        # It reads TF_CONFIG; ring all-reduce over gRPC works across CPUs and GPUs alike.
        return _KerasMultiWorkerStrategy()
    if chosen.kind == "tpu":
        return tf.distribute.TPUStrategy(chosen.tpu_resolver)
    if chosen.kind in ("multi-gpu", "multi-cpu"):
        return tf.distribute.MirroredStrategy(chosen.devices)
    if chosen.kind == "gpu":
        return tf.distribute.OneDeviceStrategy(chosen.devices[0])
    return tf.distribute.get_strategy()


class _KerasMultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """MultiWorkerMirroredStrategy as Keras 3's fit() calls it. Keras 3 (3.12 here) reduces a whole batch
    structure at once before its first step, and each epoch's scalar logs "over axis 0"; this strategy's reduce
    takes one value and no axis on a scalar, so fit() fails on two machines ("Attempt to convert a value
    (PerReplica...)", then "Invalid reduction dimension 0"): keras-team/keras#20585, tensorflow#72388 (TF's own
    multi-worker tutorial fails the same way since 2.16). Here reduce takes each value of a structure, and a
    scalar's across the replicas; the rest is the strategy itself."""

    def reduce(self, reduce_op, value, axis=None):
        def one(v):
            local = self.experimental_local_results(v)[0] if isinstance(v, tf.distribute.DistributedValues) else v
            scalar = tf.convert_to_tensor(local).shape.rank == 0
            return super(_KerasMultiWorkerStrategy, self).reduce(reduce_op, v, None if scalar else axis)

        return tf.nest.map_structure(one, value)


@contextlib.contextmanager
def policy(name: Optional[str]):
    """Keras' global dtype policy set to `name` (a plan's mixed_precision_policy; None: float32), float32 again
    after: the process may run other components next."""
    keras.mixed_precision.set_global_policy(name or "float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def split_cpu(replicas: int) -> None:
    """Splits this process's CPU into `replicas` logical devices, which plan() then trains across
    (MirroredStrategy): the multi-replica code runs for real without accelerators (no faster: they share the
    cores). Only before TensorFlow has run anything in this process."""
    if replicas <= 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError as e:
        raise TrainingDeviceError(
            f"--cpu-replicas {replicas}: TensorFlow has started in this process already ({e})"
        ) from None


def _policy(setting: str, accelerated: Optional[str]) -> Optional[str]:
    if setting == "off":
        return None
    if setting == "on":
        return accelerated or "mixed_bfloat16"  # on a CPU, bfloat16 is the mixed policy there is
    return accelerated
