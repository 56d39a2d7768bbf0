"""ImageExampleGen's pre-cache driver on Vertex AI / Kubeflow Pipelines v2.

Before the executor runs, Vertex runs a driver that resolves {SPAN} and
computes the input fingerprint that decides whether the cached result is
reused. TFX's file-based driver stats only what the input pattern's glob
matches: for a span folder, the folder itself, so images added to or replaced
in that folder would be silently ignored (a cached result reused). This driver
is TFX's, with the fingerprint taken over every file below the resolved
patterns (path, size, modification time). kubeflow/deploy.py compiles the
pipeline with this module as ImageExampleGen's driver command.
"""

import hashlib
from typing import Optional

from absl import app
from tfx.components.example_gen import input_processor
from tfx.orchestration.kubeflow.v2.file_based_example_gen import driver as tfx_driver

from components.image_example_gen import sources

DRIVER_COMMAND = ("python", "-m", "components.image_example_gen.vertex_driver")


def tree_fingerprint(input_base: str, patterns) -> str:
    """Every file below the resolved patterns: a folder's files, or a manifest and the files it names."""
    digest = hashlib.sha256()
    files = 0
    for pattern in patterns:
        pattern = pattern.rstrip("*").rstrip("/")
        source = sources.join(input_base, pattern) if pattern not in ("", ".") else input_base
        if sources.is_dir(source):
            entries = [(f"{pattern}/{rel}", size, mtime) for rel, size, mtime, _ in sources.walk(source)]
        else:
            entries = [(pattern, hashlib.sha256(sources.read_bytes(source)).hexdigest(), 0)]
            # The manifest's rows name files anywhere below the data root: one listing of it gives
            # their sizes and times (a request per file would be slow on object stores).
            stats = {rel: (size, mtime) for rel, size, mtime, _ in sources.walk(input_base)}
            for row in sources.list_source(input_base, source, "manifest").candidates:
                size, mtime = stats.get(row.rel_path, (-1, 0))
                entries.append((row.rel_path, size, mtime))
        for name, size, mtime in entries:
            digest.update(f"{name}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
            files += 1
    return f"files:{files},sha256:{digest.hexdigest()}"


class FullTreeInputProcessor(input_processor.FileBasedInputProcessor):
    """TFX's span resolution, with a fingerprint over every file of the resolved span."""

    def get_input_fingerprint(self, span: int, version: Optional[int]) -> str:
        patterns = [self.get_pattern_for_span_version(s.pattern, span, version) for s in self._splits]
        return tree_fingerprint(self._input_base_uri, patterns)


def main(args) -> None:
    # TFX's driver builds its input processor from this module attribute; this process exists
    # only to run that driver, so swapping the class here affects nothing else.
    tfx_driver.input_processor.FileBasedInputProcessor = FullTreeInputProcessor
    tfx_driver.main(args)


if __name__ == "__main__":
    app.run(main, flags_parser=tfx_driver._parse_flags)  # pylint: disable=protected-access
