"""Ingestion benchmark: ImageExampleGen against the classic per-image loop, side by side.

    python -m bench.ingest_benchmark                    # 4,000 photo-like JPEGs, 3 rounds
    python -m bench.ingest_benchmark --files 2000 --rounds 1 --sizes 1000,2000
    python -m bench.ingest_benchmark --baseline a60a88b   # ImageExampleGen of that commit too, side by side

Every measurement runs in a fresh process, the methods interleaved round by
round, so machine noise hits them alike; the table shows medians. "work" is the
time after imports (TensorFlow is imported in both the classic loop and the
TFX executor); "with import" adds the process's own import time.

Methods:
  classic      tf.io.read_file + tf.image.decode_jpeg + one TFRecord file per image (bench/classic_loop.py)
  examplegen   ImageExampleGen's executor (validate, hash, dedupe, split, write shards), local DirectRunner
  examplegen-off  the same with --near-duplicates off: no perceptual signatures, no near-duplicate search
  decode-full  bound: Pillow full decode in 2 processes, nothing written
  decode-draft bound: Pillow 1/8-scale JPEG decode in 2 processes, nothing written
  baseline     with --baseline COMMIT: ImageExampleGen's executor of that commit (a git worktree under
               bench/out, imported ahead of this checkout), measured by this file's code

--sizes also runs examplegen on corpora of several sizes and reports peak memory
(the executor process and its largest worker), which must stay flat.
"""

import argparse
import importlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time

from bench import corpus as corpus_lib
from bench import examplegen_package, measure_in_fresh_process

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
METHODS = ("classic", "examplegen", "examplegen-off", "decode-full", "decode-draft")


def _files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def _decode(args):
    path, draft = args
    from PIL import Image

    try:
        with Image.open(path) as image:
            if draft and image.format == "JPEG":
                image.draft(image.mode, (image.width // 8, image.height // 8))
            image.load()
        return 1
    except Exception:  # noqa: BLE001 - bad files are part of the corpus
        return 0


def measure_decode(corpus, draft):
    from concurrent.futures import ProcessPoolExecutor

    paths = _files(corpus)
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(int, range(2)))  # start the workers before the clock
        started = time.monotonic()
        ok = sum(pool.map(_decode, [(p, draft) for p in paths], chunksize=64))
        work = time.monotonic() - started
    return {"files": len(paths), "ok": ok, "work_seconds": work, "import_seconds": 0.0}


def measure_examplegen(corpus, scratch, code_dir=None, **component_args):
    started = time.monotonic()
    if code_dir:  # another commit's code: its modules before this checkout's (bench/ is imported already), and
        sys.path.insert(0, code_dir)  # its folder as the working directory, which ingestion's workers import from
        os.chdir(code_dir)
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    package = examplegen_package(code_dir or os.path.dirname(os.path.dirname(OUT)))  # this checkout
    executor = importlib.import_module(f"{package}.executor")
    ingest_report = importlib.import_module(f"{package}.ingest_report")
    component_module = importlib.import_module(f"{package}.component")
    ImageExampleGen, ImageIngestionReport = component_module.ImageExampleGen, component_module.ImageIngestionReport

    imported = time.monotonic()
    component = ImageExampleGen(input_base=corpus, **component_args)
    props = {
        k: proto_utils.proto_to_json(v) if hasattr(v, "DESCRIPTOR") else v
        for k, v in component.exec_properties.items()
        if v is not None
    }
    examples, report = standard_artifacts.Examples(), ImageIngestionReport()
    examples.uri, report.uri = os.path.join(scratch, "examples"), os.path.join(scratch, "report")
    os.makedirs(examples.uri)
    os.makedirs(report.uri)
    begun = time.monotonic()
    executor.Executor(executor.Executor.Context(tmp_dir=scratch)).Do(
        {}, {"examples": [examples], "report": [report]}, props
    )
    work = time.monotonic() - begun
    summary = ingest_report.read_report(report.uri)
    return {
        "files": summary["files_seen"],
        "ok": summary["examples_written"],
        "work_seconds": work,
        "import_seconds": imported - started,
    }


def measure_classic(corpus, scratch):
    from bench import classic_loop

    return classic_loop.run(corpus, os.path.join(scratch, "records"))


class ChildMemorySampler(threading.Thread):
    """Peak resident memory (VmHWM) of this process's children, sampled from /proc.

    getrusage(RUSAGE_CHILDREN) would report the parent's size for any child that
    was forked from it before exec, which says nothing about the workers.
    """

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_kb = 0
        self._done = threading.Event()

    def run(self):
        while not self._done.wait(0.05):
            for pid in _descendants(os.getpid()):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
                    self.peak_kb = max(self.peak_kb, hwm)
                except (OSError, ValueError):
                    pass

    def stop(self):
        self._done.set()
        self.join()


def _descendants(pid):
    try:
        children = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


def _measure(method, corpus, code_dir=None):
    """Runs one method in this (fresh) process; prints a JSON line."""
    scratch = tempfile.mkdtemp(prefix="bench-", dir=OUT)
    sampler = ChildMemorySampler()
    sampler.start()
    try:
        if method == "classic":
            result = measure_classic(corpus, scratch)
        elif method in ("examplegen", "baseline"):
            result = measure_examplegen(corpus, scratch, code_dir)
        elif method == "examplegen-off":
            result = measure_examplegen(corpus, scratch, near_duplicates="off")
        else:
            result = measure_decode(corpus, draft=(method == "decode-draft"))
    finally:
        sampler.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = sampler.peak_kb / 1024
    print(
        json.dumps({**result, "method": method, "peak_rss_mb": round(self_rss), "worker_peak_rss_mb": round(child_rss)})
    )


def run_fresh(method, corpus, code_dir=None):
    return measure_in_fresh_process(
        "bench.ingest_benchmark",
        ["--measure", method, "--corpus", corpus] + (["--code-dir", code_dir] if code_dir else []),
    )


def _corpus(files):
    path = os.path.join(OUT, f"corpus-{files}")
    if not os.path.exists(path):  # corpus.build renames a finished corpus into place
        print(f"built {corpus_lib.build(path, files)}", file=sys.stderr)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="", help="comma-separated corpus sizes for the memory check")
    parser.add_argument("--measure", choices=METHODS + ("baseline",), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--code-dir", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", help="also ImageExampleGen of this commit (e.g. a60a88b), side by side")
    args = parser.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    if args.measure:
        _measure(args.measure, args.corpus, args.code_dir)
        return 0

    from bench.photo_benchmark import baseline_tree

    baseline = baseline_tree(args.baseline) if args.baseline else None
    methods = METHODS + (("baseline",) if baseline else ())
    corpus = _corpus(args.files)
    runs = {m: [] for m in methods}
    for round_no in range(args.rounds):
        order = methods if round_no % 2 == 0 else tuple(reversed(methods))
        for method in order:
            runs[method].append(run_fresh(method, corpus, baseline if method == "baseline" else None))
            print(f"round {round_no + 1} {method}: {runs[method][-1]['work_seconds']:.2f} s", file=sys.stderr)

    def rate(rs, key):
        return statistics.median(r["files"] / r[key] for r in rs)

    classic_work = rate(runs["classic"], "work_seconds")
    classic_total = statistics.median(r["files"] / (r["work_seconds"] + r["import_seconds"]) for r in runs["classic"])
    report = {"corpus": corpus, "files": runs["classic"][0]["files"], "rounds": args.rounds, "methods": {}}
    print(f"\n{report['files']:,} files ({corpus}), median of {args.rounds} rounds, 2 cores")
    print(f"{'method':<15} {'work img/s':>11} {'x classic':>10} {'with import img/s':>18} {'peak RSS MB':>12}")
    for method in methods:
        work = rate(runs[method], "work_seconds")
        total = statistics.median(r["files"] / (r["work_seconds"] + r["import_seconds"]) for r in runs[method])
        rss = max(max(r["peak_rss_mb"], r["worker_peak_rss_mb"]) for r in runs[method])
        report["methods"][method] = {
            "work_images_per_s": round(work),
            "vs_classic": round(work / classic_work, 2),
            "with_import_images_per_s": round(total),
            "peak_rss_mb": rss,
            "runs": runs[method],
        }
        name = args.baseline if method == "baseline" else method
        print(f"{name:<15} {work:>11,.0f} {work / classic_work:>9.2f}x {total:>18,.0f} {rss:>12,}")
    print(f"(classic with import: {classic_total:,.0f} img/s)")

    if args.sizes:
        print("\nexamplegen peak memory as the corpus grows:")
        print(f"{'code':<13} {'files':>7} {'work img/s':>11} {'executor MB':>12} {'worker MB':>10}")
        report["sizes"] = []
        for size in [int(s) for s in args.sizes.split(",")]:
            for method in ("examplegen", "baseline") if baseline else ("examplegen",):
                r = run_fresh(method, _corpus(size), baseline if method == "baseline" else None)
                report["sizes"].append({**r, "code": args.baseline if method == "baseline" else "this"})
                print(
                    f"{report['sizes'][-1]['code']:<13} {r['files']:>7,} {r['files'] / r['work_seconds']:>11,.0f} "
                    f"{r['peak_rss_mb']:>12,} {r['worker_peak_rss_mb']:>10,}"
                )
    with open(os.path.join(OUT, "ingest.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
