"""The README and docs/ as a newcomer follows them: every link leads somewhere, every `imagepipe` command
shown is one the command line accepts, and the README's own commands that need no cloud run."""

import os
import re
import shlex
import shutil

import pytest
from commands import run_imagepipe

from cli.parser import build_parser
from pipeline.config import PROJECT_DIR

PAGES = ["README.md"] + sorted(
    os.path.join("docs", n) for n in os.listdir(os.path.join(PROJECT_DIR, "docs")) if n.endswith(".md")
)


def _text(page: str) -> str:
    with open(os.path.join(PROJECT_DIR, page), encoding="utf-8") as f:
        return f.read()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _commands(page: str):
    """(line, argv) of every `imagepipe ...` command in the page's code blocks (indented by four spaces),
    continuation lines joined, comments and a shell prompt dropped."""
    lines = _text(page).splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        code = line[4:] if line.startswith("    ") else None
        if code is None:
            continue
        code = code.strip().removeprefix("$ ")
        if not re.match(r"(\S*/)?imagepipe ", code):
            continue  # output, JSON, CSV, other tools
        while code.endswith("\\") and i < len(lines):
            code = code[:-1] + " " + lines[i].strip()
            i += 1
        words = shlex.split(code, comments=True)
        if words and os.path.basename(words[0]) == "imagepipe" and len(words) > 1:
            yield code, words[1:]


def test_the_readme_links_every_docs_page_and_every_link_resolves():
    readme = _text("README.md")
    for page in PAGES[1:]:
        assert f"]({page})" in readme, f"README.md does not link {page}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            assert os.path.exists(os.path.join(PROJECT_DIR, file)), f"{page}: {target} leads nowhere"
            if anchor and file.endswith(".md"):
                headings = re.findall(r"(?m)^#+ (.+)$", _text(file))
                assert anchor in {_anchor(h) for h in headings}, f"{page}: no heading for #{anchor} in {file}"


def test_the_readme_starts_with_what_to_run():
    first_screen = "\n".join(_text("README.md").splitlines()[:40])
    assert "make run" in first_screen and "make test" in first_screen
    assert "Python 3.12 or 3.13" in first_screen and "Python 3.10" in first_screen  # the two stacks


@pytest.mark.parametrize("page", PAGES)
def test_every_command_shown_is_one_the_command_line_accepts(page):
    parser = build_parser()
    commands = list(_commands(page))
    for line, argv in commands:
        try:
            _, unknown = parser.parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: {line!r} is refused by the command line")
        assert not unknown, f"{page}: {line!r}: unknown {unknown}"
    if page in ("README.md", "docs/data.md", "docs/prediction.md", "docs/cloud.md"):
        assert commands, f"{page} shows no imagepipe command"


@pytest.mark.slow
def test_the_readmes_using_the_model_commands_run(cli_runs, small_digits, tmp_path):
    """The README's "Using the model" block, as shown, against a run of the sample (its --root and --name
    added: that root holds two pipelines; the sample's images for the user's photos)."""
    from pipeline.config import PipelineConfig

    assert cli_runs["json"].returncode == 0
    name = PipelineConfig(root=cli_runs["root"], data=small_digits).pipeline_name
    section = _text("README.md").split("## Using the model", 1)[1].split("\n## ", 1)[0]
    image = os.path.join(small_digits, "3", sorted(os.listdir(os.path.join(small_digits, "3")))[0])
    shutil.copy(image, tmp_path / "cat.jpg")
    (tmp_path / "labels.csv").write_text("path\ncat.jpg\n")  # rows name files below the manifest's folder
    paths = {"~/new-photos": os.path.join(small_digits, "7")}
    ran = []
    for code in re.findall(r"(?m)^    (\.venv/bin/imagepipe [^#\n]*)", section):
        argv = [paths.get(word, word) for word in shlex.split(code)[1:]]
        done = run_imagepipe(*argv, "--root", cli_runs["root"], "--name", name, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, f"{code}: {done.stderr[-2000:]}"
        ran.append(argv[0])
    assert ran == ["predict", "predict", "predict", "runs", "report", "export"]
    import onnx

    assert onnx.load(str(tmp_path / "model.onnx")).producer_name == "imagepipe"  # export --format onnx --out model.onnx
    assert sum(1 for _ in open(tmp_path / "results.jsonl")) == len(os.listdir(os.path.join(small_digits, "7")))
    assert len(open(tmp_path / "maps" / "index.csv").read().splitlines()) == 2  # predict --explain: cat.jpg's map


def test_the_cloud_pages_machine_table_is_the_compiled_jobs():
    """docs/cloud.md's table of each step's machine says what kubeflow/cloud_platform.py asks for."""
    from kubeflow.cloud_platform import DATAFLOW_STEP_ARGS, STEP_MACHINES

    rows = {
        cells[0]: cells[1:]
        for cells in (
            [c.strip() for c in line.strip("|").split("|")]
            for line in _text("docs/cloud.md").splitlines()
            if line.startswith("| ") and line.count("|") == 5
        )
    }
    for step, machine in STEP_MACHINES.items():
        assert rows[step][:2] == [f"{machine.cpus:g}", f"{machine.memory_gb:g}"], step
    for step, args in DATAFLOW_STEP_ARGS.items():
        assert rows[step][2] == args[0].split("=", 1)[1], step
