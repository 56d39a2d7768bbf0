"""The whole DAG at scale: each stage's seconds and the peak memory of the whole process tree, at growing sizes.

    python -m bench.scale_benchmark --sizes 10000,30000,100000            # the default run (--model auto)
    python -m bench.scale_benchmark --sizes 10000 --extra=--model --extra=cnn
    python -m bench.scale_benchmark --table                               # the saved results' table

Each size is bench/scale_set.py's diverse photo-like set (10 classes, 160-320 px JPEGs), made once under
bench/out/. One `imagepipe run` per size in a fresh process and --root, every setting at its default unless
--extra adds options. A sampler sums the RSS of the run's process and all its descendants (Beam's workers
included) five times a second; each stage's peak is the highest sum inside its execution (from the run's own
record of when each component started and how long it ran). The table gives seconds and peak GB per stage and
size, and the ratio of each stage's peak from the smallest size to the largest (the goal: at most 1.25).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Dict, List

import psutil

from bench.photo_benchmark import save_results

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out", "scale")
IMAGEPIPE = os.path.join(os.path.dirname(sys.executable), "imagepipe")


class TreeSampler(threading.Thread):
    """(time, summed RSS of a process and its descendants) five times a second."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self._proc = psutil.Process(pid)
        self.series: List[tuple] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            try:
                tree = [self._proc] + self._proc.children(recursive=True)
                rss = 0
                for p in tree:
                    try:
                        rss += p.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                continue
            self.series.append((time.time(), rss))

    def stop(self) -> None:
        self._done.set()
        self.join()

    def peak(self, start: float = 0.0, end: float = float("inf")) -> int:
        return max((rss for t, rss in self.series if start <= t <= end), default=0)


def run(data: str, root: str, extra: List[str]) -> Dict:
    shutil.rmtree(root, ignore_errors=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    started = time.time()
    proc = subprocess.Popen(
        [IMAGEPIPE, "run", "--data", data, "--root", root, "--progress", "json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    sampler = TreeSampler(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.stop()
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    finished = next((e for e in events if e.get("event") == "run_finished"), None)
    if finished is None:
        raise RuntimeError(f"imagepipe run failed:\n{stderr[-3000:]}")
    stages = {}
    for c in finished["components"]:
        begin = c["started_ms"] / 1000
        stages[c["component"]] = {
            "seconds": c["seconds"],
            "state": c["state"],
            "peak_gb": round(sampler.peak(begin - 0.2, begin + c["seconds"] + 0.4) / 2**30, 2),
        }
    parts = {c["component"]: c for c in finished["components"]}
    evaluation = (parts.get("Evaluator") or {}).get("details") or {}
    trainer = (parts.get("Trainer") or {}).get("details") or {}
    return {
        "status": finished["status"],
        "error": finished.get("error"),
        "wall_seconds": round(time.time() - started),
        "peak_gb": round(sampler.peak() / 2**30, 2),
        "stages": stages,
        "accuracy": evaluation.get("accuracy"),
        "balanced_accuracy": evaluation.get("balanced_accuracy"),
        "model": trainer.get("model"),
        "epochs": trainer.get("epochs"),
    }


def table(results: List[Dict]) -> None:
    sizes = [r["images"] for r in results]
    stages = list(dict.fromkeys(s for r in results for s in r["stages"] if r["stages"][s]["state"] != "cached"))
    print(
        "| stage | "
        + " | ".join(f"{n:,}: s | {n:,}: peak GB" for n in sizes)
        + f" | peak {sizes[0]:,} -> {sizes[-1]:,} |"
    )
    print("|---|" + "---:|---:|" * len(sizes) + "---:|")
    for stage in stages:
        cells = []
        for r in results:
            s = r["stages"].get(stage)
            cells += [f"{s['seconds']:.0f}", f"{s['peak_gb']:.2f}"] if s else ["-", "-"]
        first, last = results[0]["stages"].get(stage), results[-1]["stages"].get(stage)
        ratio = f"{last['peak_gb'] / first['peak_gb']:.2f}" if first and last and first["peak_gb"] else "-"
        print(f"| {stage} | " + " | ".join(cells) + f" | {ratio} |")
    print(
        "| whole run | "
        + " | ".join(f"{r['wall_seconds']:,} | {r['peak_gb']:.2f}" for r in results)
        + f" | {results[-1]['peak_gb'] / results[0]['peak_gb']:.2f} |"
    )
    print("\n| images | model | epochs | eval accuracy | balanced accuracy | status |")
    print("|---:|---|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r['images']:,} | {r['model']} | {r['epochs']} | {r['accuracy'] or 0:.4f} | "
            f"{r['balanced_accuracy'] or 0:.4f} | {r['status']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,30000,100000")
    parser.add_argument("--extra", action="append", default=[], help="an option for every imagepipe run")
    parser.add_argument("--name", default="default", help="the results' name (bench/out/scale/<name>.json)")
    parser.add_argument("--table", action="store_true", help="print the saved results' table; run nothing")
    args = parser.parse_args()
    path = os.path.join(OUT, f"{args.name}.json")
    if args.table:
        table(json.load(open(path)))
        return
    from bench.scale_set import make_scale_set

    results = []
    for images in map(int, args.sizes.split(",")):
        data = make_scale_set(os.path.join(HERE, "out", f"scale-set-{images}"), images)
        result = {
            "images": images,
            "extra": args.extra,
            **run(data, os.path.join(OUT, f"root-{args.name}-{images}"), args.extra),
        }
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "stages"}), flush=True)
        save_results(results, path)
    table(results)


if __name__ == "__main__":
    main()
