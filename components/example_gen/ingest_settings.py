"""ImageExampleGen's parameters, parsed once: which files a run reads.

The executor, the local driver (component.py) and the Vertex pre-cache driver (vertex_driver.py) all
build an IngestSettings from the exec properties and ask it for the input: the latest span (resolved
here when no driver did), the window of spans before it, and the listing whose fingerprint decides
whether a cached ingestion is still valid. Nothing here runs Beam.
"""

import dataclasses
import re
from typing import Any, Dict, List, Tuple

from absl import logging
from tfx.components.example_gen import utils as example_gen_utils
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2, range_config_pb2
from tfx.types import standard_component_specs
from tfx.utils import proto_utils

from components.example_gen import ingest_defaults as defaults
from images.finding import sources
from images.finding.listing import SPLIT_ALIASES, Listing
from settings import SEED, kind, problem, taken
from storage import files as fs
from storage import review_file

REPORT_KEY = "report"  # the component's own output (beside FileBasedExampleGen's examples)
SPAN_PATTERN_KEY = "span_pattern"  # the input pattern before the driver fills in {SPAN}
SEED_KEY = "seed"  # declared with the training settings (trainer/hparams.py): the run's one seed


@dataclasses.dataclass(frozen=True)
class IngestSettings(defaults.Ingestion):
    """The component's parameters, parsed once from exec_properties: TFX's (input_base, input_config,
    output_config, the resolved span) and the declared ones (defaults.Ingestion; those TFX's configs carry,
    IN_TFX_CONFIGS, keep their defaults here and are read from input_config and output_config)."""

    input_base: str = ""
    input_config: example_gen_pb2.Input = dataclasses.field(default_factory=example_gen_pb2.Input)
    output_config: example_gen_pb2.Output = dataclasses.field(default_factory=example_gen_pb2.Output)
    span: int = 0  # resolved by the driver, else by from_exec_properties (0 without {SPAN})
    seed: int = SEED  # the order files are ingested in (ingest_order)

    @classmethod
    def from_exec_properties(cls, props: Dict[str, Any]) -> "IngestSettings":
        input_config = example_gen_pb2.Input()
        proto_utils.json_to_proto(props[standard_component_specs.INPUT_CONFIG_KEY], input_config)
        span = props.get(example_gen_utils.SPAN_PROPERTY_NAME)
        if any(re.search(r"\{(SPAN|VERSION|YYYY|MM|DD)", s.pattern) for s in input_config.splits):
            # No driver resolved the span (Kubeflow Pipelines' open-source backend does not run
            # Vertex's pre-cache driver hook): resolve the latest span here, as the driver would.
            # TFX's function also writes the resolved span into input_config's patterns.
            range_config = None
            if props.get(standard_component_specs.RANGE_CONFIG_KEY):
                range_config = range_config_pb2.RangeConfig()
                proto_utils.json_to_proto(props[standard_component_specs.RANGE_CONFIG_KEY], range_config)
            _, span, _ = example_gen_utils.calculate_splits_fingerprint_span_and_version(
                props[standard_component_specs.INPUT_BASE_KEY], input_config.splits, range_config
            )
        output_config = example_gen_pb2.Output()
        proto_utils.json_to_proto(props[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
        return cls(
            input_base=props[standard_component_specs.INPUT_BASE_KEY],
            input_config=input_config,
            output_config=output_config,
            span=int(span or 0),
            span_pattern=props.get(SPAN_PATTERN_KEY) or "",
            seed=SEED if props.get(SEED_KEY) is None else int(props[SEED_KEY]),
            **{f.name: _parameter(f, props.get(f.name)) for f in defaults.PARAMETERS},
        )

    def declared(self) -> defaults.Ingestion:
        """The declared settings alone (plain Python, no protos): what the per-file code in the workers reads."""
        return taken(defaults.Ingestion, self)

    def input_fingerprint(self) -> str:
        """What decides whether a cached ingestion still holds: every file of the listing, and the review file's
        decisions (a new decision makes a new ingestion)."""
        review = review_file.fingerprint(self.review)
        return self.list_inputs().fingerprint() + (f"\n{review}" if review else "")

    def list_inputs(self) -> Listing:
        """Lists every input split's (span-resolved) pattern into one listing.

        With span_window > 1, the latest span comes with the span_window - 1 spans before it.
        """
        splits = self.input_config.splits
        spans = self.window_spans()  # one listing of the span folders, for every split
        merged = None
        for split in splits:
            for pattern in self._window(split.pattern, spans):
                pattern = pattern.rstrip("*").rstrip("/")  # 'train/*' names the folder 'train'
                source = fs.join(self.input_base, pattern) if pattern not in ("", ".") else self.input_base
                named = None if len(splits) == 1 else SPLIT_ALIASES.get(split.name.lower(), split.name)
                listing = sources.list_source(self.input_base, source, self.layout, split=named, task=self.task)
                if merged is None:
                    merged = listing
                else:
                    # One task for the whole input: a single-label source's classes are one-label sets.
                    merged.task = "multi" if "multi" in (merged.task, listing.task) else "single"
                    merged.candidates += listing.candidates
                    merged.skipped_hidden += listing.skipped_hidden
        if len(merged.candidates) and self.span_window > 1:
            merged.source = f"{self.input_base} spans {', '.join(map(str, spans))}"
        return merged

    def window_spans(self) -> List[int]:
        """The spans read: the resolved one and the span_window - 1 largest below it."""
        pattern = self.span_pattern.rstrip("*").rstrip("/")  # 'span-{SPAN}/*' names the folder 'span-{SPAN}'
        if self.span_window <= 1 or not re.search(r"\{SPAN(:\d+)?\}", pattern):
            return [self.span]
        glob_pattern = fs.join(self.input_base, re.sub(r"\{SPAN(:\d+)?\}", "*", pattern))
        literal_parts = re.split(r"\{SPAN(?::\d+)?\}", fs.join(self.input_base, pattern))
        regex = r"(?P<span>\d+)".join(re.escape(part) for part in literal_parts)
        found = set()
        for path in fileio.glob(glob_pattern):
            match = re.fullmatch(regex, path.rstrip("/"))
            if match and int(match.group("span")) <= self.span:
                found.add(int(match.group("span")))
        window = sorted(found)[-self.span_window :] or [self.span]
        if len(window) < self.span_window:
            logging.warning(
                "ImageExampleGen: span_window is %d but only spans %s exist up to span %d",
                self.span_window,
                window,
                self.span,
            )
        return window

    def _window(self, resolved: str, spans: List[int]) -> List[str]:
        if spans == [self.span]:
            return [resolved]
        # Replace the resolved span's number in the pattern by each span of the window.
        return [
            re.sub(r"\{SPAN(:\d+)?\}", lambda m, span=span: _zero_pad(span, m.group(1)), self.span_pattern)
            for span in spans
        ]

    def output_splits(self) -> Tuple[List[str], List[int]]:
        """Names and cumulative hash buckets of the hash-assigned splits (default: train, then eval)."""
        splits = self.output_config.split_config.splits
        if not splits:
            if len(self.input_config.splits) > 1:
                return [SPLIT_ALIASES.get(s.name.lower(), s.name) for s in self.input_config.splits], list(
                    range(1, len(self.input_config.splits) + 1)
                )
            splits = defaults.hash_split_output().split_config.splits
        names, buckets, total = [], [], 0
        for s in splits:
            total += s.hash_buckets
            names.append(s.name)
            buckets.append(total)
        return names, buckets


def _zero_pad(span: int, width_spec) -> str:
    """{SPAN:2} means a zero-padded width of 2, as in TFX's own span specs."""
    return str(span).zfill(int(width_spec[1:])) if width_spec else str(span)


def _parameter(field: dataclasses.Field, value):
    """A declared parameter's exec property as its setting's type (a bool travels as an int; 0 is a value, as
    store_max_pixels's "store every original"); its default when the compiled pipeline left it out or unset ("").
    A value its declaration refuses (a job edited by hand) is one line naming the parameter, never used."""
    if value is None or value == "":
        return field.default
    value = bool(value) if field.type is bool else kind(field)(value)
    found = problem(field, value)
    if found:
        raise ValueError(f"ImageExampleGen parameter {field.name}: {found.split(': ', 1)[-1]}")
    return value
