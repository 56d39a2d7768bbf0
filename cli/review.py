"""`imagepipe review`: a local page of what a run flags, to keep, relabel or exclude each image
(review/; docs/review.md)."""

import argparse
import sys

from cli.common import EXIT_BAD_INPUT, fail, quiet_logs
from cli.history import summary_of_run
from storage import files, review_file

MAX_PORT = 65535


def cmd_review(args: argparse.Namespace) -> int:
    quiet_logs(verbose=False)
    # http.server, ML Metadata (~0.2 s): not at the CLI's start-up, which imports this module
    from review import items, server
    from runs import run_store

    # its inputs checked first, as `run` checks its own: each a line naming the option
    if not 0 <= args.port <= MAX_PORT:
        return fail(EXIT_BAD_INPUT, f"--port {args.port}: use 0 (any free port) or a port from 1 to {MAX_PORT}")
    if args.review_file and not files.is_remote(args.review_file):
        review_file.check_local(args.review_file, review_file.WRITE_OPTION)
    try:
        config, summary = summary_of_run(args)
    except run_store.NoMetadata as e:
        return fail(EXIT_BAD_INPUT, str(e))
    ingestion = next((c["details"] for c in summary["components"] if c["component"] == "ImageExampleGen"), {})
    classes = sorted(ingestion.get("label_map") or {}, key=lambda name: ingestion["label_map"][name])
    if not classes:
        return fail(
            EXIT_BAD_INPUT,
            f"run {summary['run_id']}: its ingestion left no classes to review against; "
            "review a run whose ImageExampleGen finished",
        )
    found = items.from_run(summary, args.predictions)
    log = review_file.Log(args.review_file or review_file.default_path(config.root, config.pipeline_name))
    review = server.Review(found, classes, log, multi_label=ingestion.get("task") == "multi")
    try:
        page = server.serve(review, args.port)
    except OSError as e:
        log.close()
        return fail(
            EXIT_BAD_INPUT,
            f"--port {args.port}: cannot serve on it ({e.strerror or e}); give another port, or leave --port out "
            "for any free one",
        )
    counts = {kind: sum(kind in it["kinds"] for it in found.items) for kind in items.KINDS}
    listed = ", ".join(f"{n} {items.PLURALS[kind]}" for kind, n in counts.items() if n) or "nothing to review"
    print(
        f"review of run {summary['run_id']}: {len(found.items)} images ({listed}); decisions appended to {log.path}",
        flush=True,
    )
    print(f"open {page.url}  (this machine only; Ctrl-C stops the server, every decision is already kept)", flush=True)
    data = ingestion.get("source") or ""
    data = data if data and " spans " not in data else "DATA"  # a window of spans: the --data the run was given
    print(
        f"then: imagepipe run --data {data} --root {config.root} --name {config.pipeline_name} --review {log.path}",
        file=sys.stderr,
        flush=True,
    )
    try:
        page.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        page.server_close()
        log.close()
    return 0
