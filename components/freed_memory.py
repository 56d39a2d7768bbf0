"""Freed memory handed back to the system: what a stage frees stays in glibc's heap, counted in the process's memory
for the stages after it in a local run (they run in one process)."""

import ctypes


def give_back_freed_memory() -> bool:
    """Hands the C heap's free pages back to the system (glibc's malloc_trim; nothing where there is no glibc: False).
    TensorFlow frees training's in-memory tf.data caches (a record each image: ~150 KB at 224 px) into glibc's heap,
    which keeps them: a 1.2 GB cache dropped left the process at 1.81 GB until malloc_trim(0) (then 0.67; it had
    started at 0.57). A local run's later stages run in the Trainer's process. The Evaluator's conversion of a model
    to ONNX Runtime (components/evaluator/predictions.py) leaves ~0.3 GB behind the same way."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    libc.malloc_trim(0)
    return True
