"""Full-resolution benchmark: the whole pipeline on 12 MP camera photos, this code against a baseline.

    python -m bench.photo_benchmark                          # 500 and 2,000 photos, vs the code of --baseline
    python -m bench.photo_benchmark --sizes 100 --no-baseline

For each corpus size (bench/photos.py: 4032x3024 JPEGs of ~3.7 MB, two classes)
and each code version, `imagepipe run --data CORPUS --epochs 2` runs in a fresh
process with a fresh --root. Reported: every component's images/s (images it
read / its seconds, from the run's own progress events) and the peak RSS of the
run (the process and its children, sampled every 0.2 s). The baseline is the
given commit checked out in a git worktree and imported ahead of this tree, so
both versions run in one benchmark, with the same machine noise.

A run whose memory passes --rss-limit-gb is stopped (the machine would swap or
kill something else) and reported as such.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

import psutil

from bench import photos

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Which images each component reads: all of them, or the eval split only (the Trainer's time is
# shown in seconds: it reads Transform's small pixel records, epoch after epoch).
COMPONENTS = (
    ("ImageExampleGen", "all"),
    ("StatisticsGen", "all"),
    ("Transform", "all"),
    ("Trainer", None),
    ("Evaluator", "eval"),
)


class RssSampler(threading.Thread):
    """Peak summed RSS of a process and its descendants; stops the tree past `limit` bytes."""

    def __init__(self, pid: int, limit: int):
        super().__init__(daemon=True)
        self._proc, self._limit = psutil.Process(pid), limit
        self.peak = 0
        self.killed = False
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            try:
                tree = [self._proc] + self._proc.children(recursive=True)
                rss = sum(p.memory_info().rss for p in tree if p.is_running())
            except psutil.Error:
                continue
            self.peak = max(self.peak, rss)
            if rss > self._limit:
                self.killed = True
                for p in reversed(tree):
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                return

    def stop(self) -> None:
        self._done.set()
        self.join()


def baseline_tree(commit: str) -> str:
    """A worktree of `commit` under bench/out (made once; reused while it exists)."""
    path = os.path.join(OUT, f"baseline-{commit[:12]}")
    if not os.path.isdir(path):
        subprocess.run(
            ["git", "-C", PROJECT, "worktree", "add", "--detach", path, commit], check=True, capture_output=True
        )
    return path


def run_pipeline(
    code_dir: str, corpus: str, root: str, epochs: int, rss_limit: int, extra=(), keep_root: bool = False
) -> dict:
    """One `imagepipe run` of the code in code_dir, in a fresh process; its events and peak RSS."""
    if not keep_root:
        shutil.rmtree(root, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=code_dir, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    argv = ["run", "--data", corpus, "--root", root, "--epochs", str(epochs), "--progress", "json", *extra]
    # cli/main.py since the code was split into rooms; pipeline/cli.py in the commits before (baselines). Chosen
    # by the tree, not by trying: the editable install makes this checkout's cli/ importable from any tree.
    entry = "cli.main" if os.path.exists(os.path.join(code_dir, "cli", "main.py")) else "pipeline.cli"
    code = f"import sys; from {entry} import main; sys.exit(main({argv!r}))"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=code_dir, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    sampler = RssSampler(proc.pid, rss_limit)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.stop()
    events = []
    for line in stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    seconds = {e["component"]: (e["seconds"], e["state"]) for e in events if e.get("event") == "component_finished"}
    finished = next((e for e in events if e.get("event") == "run_finished"), {})
    evaluation = next(
        (c.get("details") or {} for c in finished.get("components", []) if c.get("component") == "Evaluator"), {}
    )
    error = finished.get("error") or (stderr.strip().splitlines() or [""])[-1]
    return {
        "returncode": proc.returncode,
        "wall_seconds": round(time.monotonic() - started, 1),
        "peak_rss_gb": round(sampler.peak / 2**30, 2),
        "killed_over_rss_limit": sampler.killed,
        "status": finished.get("status", "killed" if sampler.killed else "failed"),
        "error": None if proc.returncode == 0 else error[:300],
        "components": seconds,
        "splits": _split_counts(root),
        "accuracy": evaluation.get("accuracy"),
        "blessed": evaluation.get("blessed"),
        "details": {c.get("component"): c.get("details") or {} for c in finished.get("components", [])},
    }


def _split_counts(root: str) -> Dict[str, int]:
    """Examples per split from ImageExampleGen's summary.json under root (empty if it never finished)."""
    for folder, _, files in os.walk(os.path.join(root, "pipelines")):
        if "summary.json" in files and "ImageExampleGen" in folder:
            with open(os.path.join(folder, "summary.json")) as f:
                return json.load(f)["examples_per_split"]
    return {}


def images_per_second(result: dict, component: str, reads: str) -> Optional[float]:
    seconds, state = result["components"].get(component, (None, None))
    splits = result["splits"]
    if not seconds or state != "ran" or not splits:
        return None
    count = sum(splits.values()) if reads == "all" else splits.get(reads, 0)
    return round(count / seconds, 1)


def _rates(r: dict) -> List[Optional[float]]:
    return [images_per_second(r, c, reads) if reads else r["components"].get(c, (None,))[0] for c, reads in COMPONENTS]


def table(results: List[dict]) -> List[str]:
    head = ["photos", "code", "status", "accuracy", "peak RSS GB", "wall s"] + [
        f"{c} {'img/s' if reads else 's'}" for c, reads in COMPONENTS
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        rates = _rates(r)
        status = r["status"] if not r["killed_over_rss_limit"] else "stopped: RSS over limit"
        failed_at = [c for c, (_, s) in r["components"].items() if s == "failed"]
        if failed_at:
            status += f" at {failed_at[0]}"
        accuracy = "-" if r.get("accuracy") is None else f"{r['accuracy']:.3f}" + (" blessed" if r["blessed"] else "")
        lines.append(
            "| "
            + " | ".join(
                [f"{r['photos']:,}", r["code"], status, accuracy, f"{r['peak_rss_gb']:.1f}", f"{r['wall_seconds']:.0f}"]
                + [f"{v:,.1f}" if v else "-" for v in rates]
            )
            + " |"
        )
        base = next((b for b in results if b["photos"] == r["photos"] and b["code"] != "this"), None)
        if r["code"] == "this" and base and base["status"] == "complete":

            def ratio(new, old, faster):
                return f"**{(new / old if faster else old / new):.2f}x**" if new and old else "-"

            lines.append(
                "| "
                + " | ".join(
                    [
                        f"{r['photos']:,}",
                        "speed-up (RSS: fraction)",
                        "",
                        "",
                        ratio(base["peak_rss_gb"], r["peak_rss_gb"], False),
                        ratio(r["wall_seconds"], base["wall_seconds"], False),
                    ]
                    + [ratio(n, o, reads is not None) for n, o, (_, reads) in zip(rates, _rates(base), COMPONENTS)]
                )
                + " |"
            )
    return lines


def save_results(results: List[dict], path: str) -> None:
    """The results' JSON at --out (its folder made)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def comparison_parser(doc: str, baseline: str, baseline_help: str, epochs: int, out: str) -> argparse.ArgumentParser:
    """The options every this-code-against-a-commit benchmark takes: --baseline, --no-baseline, --epochs,
    --out (the results' JSON) and --table (print the table of --out; run nothing)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--baseline", default=baseline, help=baseline_help)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--out", default=out)
    parser.add_argument("--table", action="store_true", help="print the table of the results in --out; run nothing")
    return parser


def printed_saved_table(args, table) -> bool:
    """With --table: prints table(the results in --out) and says so."""
    if args.table:
        with open(args.out) as f:
            print("\n".join(table(json.load(f))))
    return args.table


def main(argv=None) -> int:
    parser = comparison_parser(
        __doc__,
        "56723b0",
        "commit to compare with (the code before full-resolution support)",
        2,
        os.path.join(OUT, "photo_benchmark.json"),
    )
    parser.add_argument("--sizes", default="500,2000", help="corpus sizes (photos), comma-separated")
    parser.add_argument("--baseline-sizes", help="sizes to run the baseline on (default: all)")
    parser.add_argument("--rss-limit-gb", type=float, default=18.0)
    args = parser.parse_args(argv)
    if printed_saved_table(args, table):
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    baseline_sizes = {int(s) for s in (args.baseline_sizes or args.sizes).split(",")}
    versions = [("this", PROJECT)]
    if not args.no_baseline:
        versions.append((f"baseline {args.baseline}", baseline_tree(args.baseline)))
    results = []
    for size in sizes:
        corpus = photos.ensure(os.path.join(OUT, f"photos-{size}"), size)
        print(f"corpus: {corpus}", file=sys.stderr)
        for name, code_dir in versions:
            if name != "this" and size not in baseline_sizes:
                continue
            root = os.path.join(OUT, "photo-runs", f"{size}-{name.split()[0]}")
            result = run_pipeline(code_dir, corpus["root"], root, args.epochs, int(args.rss_limit_gb * 2**30))
            result.update(photos=size, code=name, corpus_bytes=corpus["bytes"])
            results.append(result)
            print(json.dumps(result), file=sys.stderr)
            save_results(results, args.out)  # kept as it goes: a later run may take the machine down
            shutil.rmtree(root, ignore_errors=True)  # gigabytes of records
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
