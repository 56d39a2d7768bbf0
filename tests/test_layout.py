"""The layout's rules that code can break silently: imports run one way, from the top folder down to storage, a
folder a layer; the stages of the DAG import each other without a loop; no module imports itself back.

    bench/        benchmarks (they drive the commands)
    cli/          the command line (nothing but bench imports it)
    kubeflow/     the pipeline compiled, submitted and scheduled on Vertex AI / Kubeflow
    review/       `imagepipe review`: what a run flags, on a local page, decided by a person
    pipeline/     the DAG: create_pipeline, its configuration, the platform, the local runner (it writes the report)
    report/       a run's HTML report
    prediction/   classifying images with a pushed model (in process, on Beam)
    runs/         run history in ML Metadata, one run at a time, live progress, the summary
    components/   the stages of the DAG, a folder each (what runs in the pipeline image and on workers)
    trainer/      the model code: hparams, inputs, Keras models, strategy, exports, run_fn (imports no stage)
    storage/      files local or in an object store, output file names, artifact types, the one-line errors
    settings/     a setting's one declaration
    stacks/       the two supported stacks: what differs between them in code
"""

import ast
import os
from typing import Dict, Iterator, Set

import pytest

from pipeline.config import PROJECT_DIR

LAYERS = [
    "bench",
    "cli",
    "kubeflow",
    "review",
    "pipeline",
    "report",
    "prediction",
    "runs",
    "components",
    "trainer",
    "images",
    "storage",
    "settings",
    "stacks",
]
LEVEL = {folder: level for level, folder in enumerate(LAYERS)}


def _imports(path) -> Iterator[str]:
    """Every module `path` imports, at its top or inside a function (a late import is an import too)."""
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module
            # `from package import module` imports the module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _modules(folder) -> Iterator[str]:
    for dirpath, dirs, names in os.walk(os.path.join(PROJECT_DIR, folder)):
        dirs[:] = [d for d in dirs if d not in ("out", "__pycache__")]  # bench/out: copies of older commits
        yield from (os.path.join(dirpath, n) for n in names if n.endswith(".py"))


def _module_name(path: str) -> str:
    name = os.path.relpath(path, PROJECT_DIR)[:-3].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _graph() -> Dict[str, Set[str]]:
    """The project's own modules and the project modules each imports."""
    paths = [p for folder in LAYERS for p in _modules(folder)]
    names = {_module_name(p): p for p in paths}
    return {name: {m for m in _imports(path) if m in names and m != name} for name, path in names.items()}


def test_every_python_folder_has_a_layer():
    folders = {
        entry.name
        for entry in os.scandir(PROJECT_DIR)
        if entry.is_dir() and any(n.endswith(".py") for n in os.listdir(entry.path))
    }
    assert folders - {"tests"} == set(LEVEL)


@pytest.mark.parametrize("folder", LAYERS)
def test_imports_run_downwards_only(folder):
    upward = []
    modules = list(_modules(folder))
    for path in modules:
        for module in _imports(path):
            top = module.split(".")[0]
            if top in LEVEL and LEVEL[top] < LEVEL[folder]:
                upward.append(f"{os.path.relpath(path, PROJECT_DIR)} imports {module}")
    assert modules and not upward, "\n".join(upward)


def test_a_stage_s_inner_folders_are_its_own():
    """What several parts use of images (checks, finding the files, the codec, TFRecords, near-duplicates) is the
    image library's (images/): no module outside ImageExampleGen's folder reaches into its inner folders."""
    inner = ("components.example_gen.writing", "components.example_gen.splitting")
    reaching = [
        f"{os.path.relpath(path, PROJECT_DIR)} imports {module}"
        for folder in LAYERS
        for path in _modules(folder)
        if not _module_name(path).startswith("components.example_gen")
        for module in _imports(path)
        if module.startswith(inner)
    ]
    assert not reaching, "\n".join(reaching)


def test_every_module_is_on_a_map():
    """docs/layout.md, or the map in its folder's __init__.py, names every module: the layout a newcomer reads is
    the one the code has."""
    layout = open(os.path.join(PROJECT_DIR, "docs", "layout.md")).read()
    unnamed = []
    for folder in LAYERS:
        for path in _modules(folder):
            name = os.path.basename(path)
            if name in ("__init__.py", "__main__.py") or name in layout:
                continue
            package = os.path.join(os.path.dirname(path), "__init__.py")
            if not (os.path.exists(package) and name in open(package).read()):
                unnamed.append(os.path.relpath(path, PROJECT_DIR))
    assert not unnamed, f"on no map (docs/layout.md or the folder's __init__.py): {unnamed}"


def test_the_docs_name_only_files_that_exist():
    """A module named in the docs (README.md, docs/*.md) by its path is where they say: a move updates them."""
    import glob
    import re

    named = re.compile(r"\b(?:" + "|".join(LAYERS) + r")/[A-Za-z0-9_/]+\.py\b")
    missing = []
    for doc in [os.path.join(PROJECT_DIR, "README.md"), *glob.glob(os.path.join(PROJECT_DIR, "docs", "*.md"))]:
        for path in set(named.findall(open(doc).read())):
            if not os.path.exists(os.path.join(PROJECT_DIR, path)):
                missing.append(f"{os.path.relpath(doc, PROJECT_DIR)} names {path}")
    assert not missing, "\n".join(missing)


def test_the_cloud_guide_names_every_runtime_parameter():
    from pipeline.runtime_parameters import RUNTIME_PARAMETERS

    guide = open(os.path.join(PROJECT_DIR, "docs", "cloud.md")).read()
    assert [name for name in RUNTIME_PARAMETERS if f"`{name}`" not in guide] == []


def test_storage_imports_nothing_of_the_project_but_itself():
    for path in _modules("storage"):
        others = {m.split(".")[0] for m in _imports(path)} & set(LEVEL) - {"storage"}
        assert not others, f"{path} imports {others}"


def _cycle(graph: Dict[str, Set[str]]):
    """One loop of the graph as a list of nodes, or None."""
    state: Dict[str, int] = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_module_imports_itself_back():
    loop = _cycle(_graph())
    assert loop is None, " -> ".join(loop)


def test_the_stages_import_each_other_without_a_loop():
    """components/<stage>/ folders: a stage may use another's files (the Trainer the features' names, the model
    card the Evaluator's results), never both ways round, so each stage can be read from the ones below it."""
    stage_of = lambda module: ".".join(module.split(".")[:2])  # noqa: E731
    stages: Dict[str, Set[str]] = {}
    for module, imported in _graph().items():
        if module.startswith("components."):
            stages.setdefault(stage_of(module), set()).update(
                stage_of(m) for m in imported if m.startswith("components.") and stage_of(m) != stage_of(module)
            )
    loop = _cycle(stages)
    assert loop is None, " -> ".join(loop)


def test_each_stage_of_the_dag_has_its_folder():
    """The stages as the DAG and the run summary name them, each a folder of components/."""
    stages = {
        "example_gen",
        "validation",
        "transform",
        "features",
        "health",
        "tuner",
        "trainer",
        "evaluator",
        "model_card",
        "pusher",
    }
    folders = {e.name for e in os.scandir(os.path.join(PROJECT_DIR, "components")) if e.is_dir()} - {"__pycache__"}
    assert folders == stages


def test_the_model_code_imports_no_stage():
    imported = {m for path in _modules("trainer") for m in _imports(path)}
    assert not {m for m in imported if m.split(".")[0] in ("components", "pipeline", "runs")}


# What the command line's start-up must not load: `imagepipe --help`, `imagepipe runs` and a mistyped option answer in
# under a second, where TensorFlow alone takes ~4 s to import here (TFX, Beam and TFMA with it: ~12 s).
HEAVY_LIBRARIES = ("tensorflow", "tfx", "apache_beam", "keras", "tensorflow_model_analysis", "sklearn")


def test_the_command_line_starts_without_tensorflow():
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, cli.main; print(*[m for m in {HEAVY_LIBRARIES} if m in sys.modules])"],
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not loaded, f"importing cli.main loads {loaded}: import them inside the function that needs them"


def _late_imports(path) -> Iterator[int]:
    """The line of each import inside a function (a class's method too) of `path`."""
    tree = ast.parse(open(path).read(), path)
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node.lineno


def test_an_import_inside_a_function_says_why():
    """Imports sit at the top of a module; one inside a function says why on its line or the line above (a start-up
    it keeps light, a cycle it avoids, a library only one command needs)."""
    silent = []
    for path in (p for folder in LAYERS if folder != "bench" for p in _modules(folder)):
        lines = open(path).read().split("\n")
        for n in sorted(set(_late_imports(path))):
            first = n - 1  # a run of imports shares the comment on any of its lines or just above them
            while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                first -= 1
            if not any("#" in line for line in lines[max(0, first - 1) : n]):
                silent.append(f"{os.path.relpath(path, PROJECT_DIR)}:{n}")
    assert not silent, f"{len(silent)} imports inside functions say nothing of why: {silent}"
