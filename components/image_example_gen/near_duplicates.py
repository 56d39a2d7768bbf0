"""Near-duplicate groups among the examples written (signatures and the pair test: similarity.py).

In ImageExampleGen's Beam graph, beside the exact duplicates (same bytes, grouped by hash):

  Metas, batched --band_items--> (band, value): [items] --GroupByKey--> bucket_pairs --> near pairs
  Meta --sample of 500--> similarity.thresholds --> the limits bucket_pairs applies (a side input)

Only metadata travels, as for exact duplicates. Then, in the executor, group() joins the pairs into
groups (connected images), and decide() says what each group means: copies across train and eval
(eval leakage: the eval accuracy flatters the model), the same picture under two labels (a
conflict), copies within one class. With --near-duplicates drop, every group with one label keeps
one copy (in the first split, train before eval) and the others are quarantined as `near_duplicate`;
groups with conflicting labels are reported, never resolved by guessing.
"""

import collections
from typing import Dict, Iterable, List, Sequence, Tuple

from components.image_example_gen import similarity
from components.image_example_gen.batch_ingest import Meta, bad_row
from components.image_example_gen.image_check import Reason
from components.image_example_gen.sources import split_sort_key

EXAMPLES_SHOWN = 20  # groups kept in summary.json (all of them are in near_duplicates.csv)
BATCH = 1000  # images whose bucket entries travel together
Item = Tuple[tuple, bytes]  # (the Meta's fields but its signature, the signature): what a bucket holds


def band_items(metas: List[Meta], width: int) -> Iterable[Tuple[Tuple[int, int], List[Item]]]:
    """(bucket, the items of `metas` in it) for each bucket a batch of images goes into: each image goes
    into ~24 buckets (8 bands at 3 crops); a batch sends each bucket once instead of an element per image
    and bucket through Beam's shuffle (measured on 1,886 digits: 0.3 s of the search's 2.9 s)."""
    buckets = collections.defaultdict(list)
    for meta in metas:
        if meta.signature:
            signature = bytes.fromhex(meta.signature)
            item = (tuple(meta[:-1]), signature)
            for key in similarity.band_keys(signature, width):
                buckets[key].append(item)
    return buckets.items()


SAMPLE = 500  # signatures the limits are drawn from (125k pairs: enough for a mean and a spread)


def limits_from(sample: List[Meta]) -> similarity.Limits:
    return similarity.thresholds([bytes.fromhex(m.signature) for m in sample if m.signature])


def bucket_pairs(element, limits: similarity.Limits) -> Iterable[Tuple[tuple, tuple]]:
    """Near-duplicate pairs of one bucket, each as (first, second) by path, as the Meta fields but the signature:
    only the pairs that join two groups of the bucket (a spanning forest), so a bucket of n look-alike
    images (a folder of blank frames) sends at most n - 1 pairs, not n^2 / 2. Copies of the same bytes
    are exact duplicates, handled apart."""
    _, parts = element  # the bucket's items, in lists from each batch
    items = sorted((item for part in parts for item in part), key=lambda item: item[0][1])  # by path
    parent = list(range(len(items)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in similarity.pairs_in_bucket([signature for _, signature in items], limits):
        (first, _), (second, _) = items[i], items[j]
        if first[0] != second[0] and root(i) != root(j):  # not the same bytes (sha256)
            parent[root(i)] = root(j)
            yield first, second


def group(pairs: Sequence[Tuple[Meta, Meta]], removed: Iterable[str] = ()) -> List[List[Meta]]:
    """Connected groups of the pairs (union-find), leaving out examples already removed (exact duplicates
    quarantined); each group sorted by split then path, groups by their first member's path."""
    gone = set(removed)
    parent: Dict[str, str] = {}
    metas: Dict[str, Meta] = {}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        if a.rel_path in gone or b.rel_path in gone:
            continue
        for m in (a, b):
            metas[m.rel_path] = m
            parent.setdefault(m.rel_path, m.rel_path)
        parent[root(a.rel_path)] = root(b.rel_path)
    groups = collections.defaultdict(list)
    for path in metas:
        groups[root(path)].append(metas[path])
    return sorted((sorted(g, key=lambda m: (split_sort_key(m.split), m.rel_path)) for g in groups.values()),
                  key=lambda g: g[0].rel_path)


def decide(groups: List[List[Meta]], mode: str, eval_examples: int) -> Tuple[Dict, List[Tuple[Meta, Dict]]]:
    """(the summary's near-duplicate fields, the copies to quarantine under --near-duplicates drop)."""
    rejected = []
    leaked = conflicts = 0
    for g in groups:
        labels = {m.label for m in g}
        splits = {m.split for m in g}
        conflicts += len(labels) > 1
        if "train" in splits:
            leaked += sum(m.split == "eval" for m in g)
        if mode == "drop" and len(labels) == 1:
            kept = g[0]  # the first split's first path: train before eval
            rejected += [(m, bad_row(m.rel_path, Reason.NEAR_DUPLICATE,
                                     f"near-duplicate of {kept.rel_path} ({kept.split}); kept there only", m.label,
                                     m.split)) for m in g[1:]]
    summary = {
        "near_duplicate_groups": len(groups),
        "near_duplicate_files": sum(len(g) for g in groups),
        # Eval examples with a near-duplicate in train (counted before any drop).
        "near_duplicate_eval_leaks": leaked,
        "near_duplicate_eval_leak_fraction": round(leaked / eval_examples, 6) if eval_examples else 0.0,
        "near_duplicate_conflicts": conflicts,
        "near_duplicate_within_class": sum(len({m.label for m in g}) == 1 for g in groups),
        # Shown first: conflicting labels, then copies across train and eval, then copies within a class.
        "near_duplicate_examples": [[[m.rel_path, m.label, m.split] for m in g] for g in sorted(
            groups, key=lambda g: (len({m.label for m in g}) == 1, len({m.split for m in g}) == 1))[:EXAMPLES_SHOWN]],
        "near_duplicates_dropped": len(rejected),
    }
    return summary, rejected


def csv_rows(groups: List[List[Meta]]) -> List[Dict[str, str]]:
    """near_duplicates.csv: a row per member, groups numbered from 1."""
    return [{"group": str(n), "path": m.rel_path, "label": m.label, "split": m.split}
            for n, g in enumerate(groups, start=1) for m in g]
