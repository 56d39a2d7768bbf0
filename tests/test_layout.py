"""The layout's one rule that code can break silently: imports run one way, from the command line down to
storage. Each folder has one job; a folder may import the folders below it, never one above.

    cli/                     the command line (nothing imports it)
    kubeflow/                the pipeline compiled, submitted and scheduled on Vertex AI / Kubeflow
    report/                  a run's HTML report
    prediction/              classifying images with a pushed model (in process, on Beam)
    pipeline/                the DAG: create_pipeline, its configuration, the platform, the local runner
    runs/                    run history in ML Metadata, one run at a time, live progress, the summary
    components/, trainer/    what runs inside the DAG (in the pipeline image, on Dataflow and Vertex workers)
    storage/                 files local or in an object store, the one-line errors

components/ and trainer/ share a layer: the trainer reads the features components write, and
components read the trainer's training log. bench/ sits beside cli/ (it drives the commands).
"""

import ast
import os

import pytest

from pipeline.config import PROJECT_DIR

LAYERS = [("cli", "bench"), ("kubeflow",), ("report",), ("prediction",), ("pipeline",), ("runs",),
          ("components", "trainer"), ("storage",)]
LEVEL = {folder: level for level, folders in enumerate(LAYERS) for folder in folders}


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def _modules(folder):
    for dirpath, dirs, names in os.walk(os.path.join(PROJECT_DIR, folder)):
        dirs[:] = [d for d in dirs if d not in ("out", "__pycache__")]  # bench/out: copies of older commits
        yield from (os.path.join(dirpath, n) for n in names if n.endswith(".py"))


def test_every_python_folder_has_a_layer():
    folders = {entry.name for entry in os.scandir(PROJECT_DIR) if entry.is_dir() and any(
        n.endswith(".py") for n in os.listdir(entry.path))}
    assert folders - {"tests"} == set(LEVEL)


@pytest.mark.parametrize("folder", sorted(LEVEL))
def test_imports_run_downwards_only(folder):
    upward = []
    modules = list(_modules(folder))
    for path in modules:
        for module in _imports(path):
            top = module.split(".")[0]
            if top in LEVEL and LEVEL[top] < LEVEL[folder]:
                upward.append(f"{os.path.relpath(path, PROJECT_DIR)} imports {module}")
    assert modules and not upward, "\n".join(upward)


def test_storage_imports_nothing_of_the_project_but_itself():
    for path in _modules("storage"):
        others = {m.split(".")[0] for m in _imports(path)} & set(LEVEL) - {"storage"}
        assert not others, f"{path} imports {others}"
