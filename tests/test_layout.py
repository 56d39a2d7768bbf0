"""The layout's one rule that code can break silently: imports run downwards only.

pipeline/ and kubeflow/ assemble and run the DAG; components/ and trainer/ are what runs inside it
(in the pipeline image, on Dataflow workers, in Vertex Training jobs), so they never import the
layers above them.
"""

import ast
import os

import pytest

from pipeline.config import PROJECT_DIR


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


@pytest.mark.parametrize("folder", ["components", "trainer"])
def test_components_and_trainer_never_import_the_layers_that_run_them(folder):
    checked = 0
    for dirpath, _, names in os.walk(os.path.join(PROJECT_DIR, folder)):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                upward = [m for m in _imports(path) if m.split(".")[0] in ("pipeline", "kubeflow")]
                assert not upward, f"{os.path.relpath(path, PROJECT_DIR)} imports {upward}"
                checked += 1
    assert checked >= 5
