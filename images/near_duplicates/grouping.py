"""Near-duplicate groups among the examples written (signatures and the pair test: similarity.py).

Images that share a bucket (a band of their pHash: similarity.band_bits) are compared, with the limits drawn
from a sample of SAMPLE signatures (those of the smallest content hashes, so that both ways below draw the same).
Where the signatures fit in memory (192 bytes an image: 100,000 images are 19 MB) and the run is local, the
search is one vectorised pass in the executor's process after the Beam run (search_files: the workers write
each batch's signatures to a file): 0.5 s on the ingestion benchmark's 4,000 photos, where the Beam stages below
took 2.2 s. On Dataflow, or past MEMORY_MAX_IMAGES, it is part of ImageExampleGen's Beam graph, beside the
exact duplicates (same bytes, grouped by hash):

  Metas, batched --band_items--> (band, value): [items] --GroupByKey--> bucket_pairs --> near pairs
  signed Metas --the SAMPLE of the smallest hashes--> similarity.thresholds --> the limits (a side input)

Only metadata travels, as for exact duplicates. Both ways test the pairs of a bucket with the same test
(similarity.near), so they find the same groups (tests/test_data_health.py). Then, in the executor, group()
joins the pairs into groups (connected images), and decide() says what each group means: copies across train and eval
(eval leakage: the eval accuracy flatters the model), the same picture under two labels (a
conflict), copies within one class. With --near-duplicates drop, every group with one label keeps
one copy (in the first split, train before eval) and the others are quarantined as `near_duplicate`;
groups with conflicting labels are reported, never resolved by guessing.
"""

import collections
import json
import uuid
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np

from images.finding.listing import split_sort_key
from images.image_check import Reason, bad_row
from images.near_duplicates import similarity
from storage import files as fs

EXAMPLES_SHOWN = 20  # groups kept in summary.json (all of them are in near_duplicates.csv)
BATCH = 1000  # images whose bucket entries travel together
# A written example's record, without its bytes (components/example_gen/writing/batch_ingest.py's Meta, a
# NamedTuple whose last field is the signature's hex): what is grouped here reads sha256, rel_path, label, split.
Meta = Any
Item = Tuple[tuple, bytes]  # (the Meta's fields but its signature, the signature): what a bucket holds
SIGNATURES_DIR = "signatures"  # in the staging folder: a batch's signatures (search_files)
SIGNATURE_ROW = similarity.SIGNATURE_BYTES + 32  # a signature, then the SHA-256 of the file's bytes


def write_signatures(metas: List[Meta], staging_dir: str, batch_key: str) -> str:
    """Writes the metas' signatures and content hashes (SIGNATURE_ROW bytes each) to <name>.bin and the metas
    without them to <name>.json; returns the .bin's path. The random part keeps a retried batch apart."""
    path = fs.join(staging_dir, SIGNATURES_DIR, f"{batch_key}-{uuid.uuid4().hex[:8]}.bin")
    fs.write_bytes(path, b"".join(bytes.fromhex(m.signature) + bytes.fromhex(m.sha256) for m in metas))
    fs.write_bytes(path[: -len(".bin")] + ".json", json.dumps([list(m[:-1]) for m in metas]).encode("ascii"))
    return path


class Joined:
    """Groups joined pair by pair (union-find); a group's root is its least member."""

    def __init__(self):
        self._parent: Dict = {}

    def root(self, x):
        parent = self._parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def join(self, a, b) -> bool:
        """Joins the groups of a and b; whether they were two."""
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)
        return ra != rb

    def members(self) -> List:
        return list(self._parent)


def band_items(
    metas: List[Meta], limits: similarity.NearDuplicateLimits, images: int
) -> Iterable[Tuple[Tuple[int, int], List[Item]]]:
    """(bucket, the items of `metas` in it) for each bucket a batch of images goes into (similarity.band_bits):
    a batch sends each bucket once instead of an element per image and bucket through Beam's shuffle (measured
    on 1,886 digits: 0.3 s of the search's 2.9 s)."""
    signed = [meta for meta in metas if meta.signature]
    if not signed:
        return []
    signatures = [bytes.fromhex(meta.signature) for meta in signed]
    buckets = collections.defaultdict(list)
    codes = similarity.band_codes(signatures, similarity.band_bits(limits, images))
    for meta, signature, row in zip(signed, signatures, codes):
        item = (tuple(meta[:-1]), signature)
        for code in set(row.tolist()):
            buckets[(code >> 40, code & ((1 << 40) - 1))].append(item)
    return buckets.items()


SAMPLE = 500  # signatures the limits are drawn from (125k pairs: enough for a mean and a spread)


def sample_key(meta: Meta) -> str:
    return meta.sha256  # the sample is the signed Metas of the SAMPLE smallest content hashes


def limits_from(sample: List[Meta]) -> similarity.NearDuplicateLimits:
    return similarity.thresholds([bytes.fromhex(m.signature) for m in sample if m.signature])


def bucket_pairs(element, limits: similarity.NearDuplicateLimits) -> Iterable[Tuple[tuple, tuple]]:
    """Near-duplicate pairs of one bucket (Beam's way), each as (first, second) by path, as the Meta fields but the
    signature: only the pairs that join two groups of the bucket (a spanning forest), so a bucket of n look-alike
    images (a folder of blank frames) sends at most n - 1 pairs, not n^2 / 2."""
    _, parts = element  # the bucket's items, in lists from each batch
    items = sorted((item for part in parts for item in part), key=lambda item: item[0][1])  # by path
    if len(items) < 2:
        return
    # Exact copies (one content hash) are tested once, as search() does: then each copy joins its image's group.
    first_of: Dict[str, int] = {}
    for k, (fields, _) in enumerate(items):
        first_of.setdefault(fields[0], k)
    distinct = sorted(first_of.values())
    h = similarity.hashes([items[k][1] for k in distinct])
    content = np.array([bytes.fromhex(items[k][0][0]) for k in distinct])
    joined = Joined()
    for i, j in similarity.bucket_candidates(np.zeros(len(distinct), np.int64), np.arange(len(distinct))):
        for a, b in zip(*_near_pairs(h, content, i, j, limits)):
            if joined.join(a, b):
                yield items[distinct[a]][0], items[distinct[b]][0]
    grouped = {distinct[a] for a in joined.members()}
    for k, (fields, _) in enumerate(items):
        if first_of[fields[0]] != k and first_of[fields[0]] in grouped:
            yield items[first_of[fields[0]]][0], items[k][0]


def _near_pairs(
    h: similarity.Hashes, content: np.ndarray, i: np.ndarray, j: np.ndarray, limits: similarity.NearDuplicateLimits
) -> Tuple[List[int], List[int]]:
    """The candidate pairs that are near-duplicates; copies of the same bytes (one content hash) are exact
    duplicates, handled apart."""
    found = similarity.near(h, i, j, limits) & (content[i] != content[j])
    return i[found].tolist(), j[found].tolist()


# The search runs in the executor's memory up to this many images (192 bytes each, and the bucket index: ~0.5 GB
# at most), on the local runners; Beam's GroupByKey past it, and on Dataflow (ImageExampleGen's executor).
MEMORY_MAX_IMAGES = 2_000_000


LARGE_BUCKET = 32  # buckets of more images are tested as matrix products (similarity.near_in_group)


def search(
    rows: np.ndarray, content: np.ndarray, limits: similarity.NearDuplicateLimits, images: int
) -> List[Tuple[int, int]]:
    """The near-duplicate groups among rows [n, SIGNATURE_BYTES] uint8 (content: their SHA-256 digests), as pairs
    (the first image of each group with each other one). Exact copies (one content hash) are searched once: the
    search runs on one image per content, then each copy of an image in a group joins it (a manifest naming two
    files 5,000 times made buckets of 2,500 copies, every pair of them tested and then skipped: quadratic)."""
    distinct, first, inverse = np.unique(content, return_index=True, return_inverse=True)
    if len(distinct) == len(content):
        return _search(rows, content, limits, images)
    pairs = [(int(first[a]), int(first[b])) for a, b in _search(rows[first], content[first], limits, images)]
    grouped = {k for pair in pairs for k in pair}
    order = np.argsort(inverse, kind="stable")  # the copies of each content together, in image order
    bounds = np.r_[0, np.cumsum(np.bincount(inverse, minlength=len(distinct)))]
    for u in range(len(distinct)):
        representative = int(first[u])
        if representative in grouped:
            pairs += [(representative, int(k)) for k in order[bounds[u] : bounds[u + 1]] if k != representative]
    return pairs


def _search(
    rows: np.ndarray, content: np.ndarray, limits: similarity.NearDuplicateLimits, images: int
) -> List[Tuple[int, int]]:
    """search() on rows of distinct contents, in one vectorised pass: every image's buckets at once, every pair of
    images sharing a bucket tested (the pairs Beam's way tests, bucket by bucket): those of the small buckets in
    chunks, each large bucket (look-alike images) as matrix products; the passing pairs joined into groups."""
    h = similarity.hashes(rows)
    joined = Joined()
    flat, image = similarity.buckets(similarity.band_codes(rows, similarity.band_bits(limits, images)))
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]]) if len(flat) else np.zeros(0, int)
    sizes = np.diff(np.r_[starts, len(flat)])
    small = np.repeat(sizes <= LARGE_BUCKET, sizes)
    for i, j in similarity.bucket_candidates(flat[small], image[small]):  # many small buckets, pairs in bulk
        for a, b in zip(*_near_pairs(h, content, i, j, limits)):
            joined.join(a, b)
    for start, size in zip(starts[sizes > LARGE_BUCKET], sizes[sizes > LARGE_BUCKET]):  # a few large ones
        members = image[start : start + size]
        for i, j in similarity.near_in_group(similarity.parse(rows[members]), limits):
            for a, b in zip(members[i].tolist(), members[j].tolist()):
                if content[a] != content[b]:
                    joined.join(a, b)
    return [(joined.root(image), image) for image in joined.members() if joined.root(image) != image]


def search_files(paths: Sequence[str], images: int) -> List[Tuple[list, list]]:
    """The near-duplicate pairs, as the fields of their Metas (without signatures), among the signatures the
    ingestion workers wrote (write_signatures), with the limits drawn from them."""
    paths = sorted(paths)
    tables = [np.frombuffer(fs.read_bytes(path), np.uint8).reshape(-1, SIGNATURE_ROW) for path in paths]
    table = np.concatenate(tables) if tables else np.zeros((0, SIGNATURE_ROW), np.uint8)
    rows = table[:, : similarity.SIGNATURE_BYTES]
    content = table[:, similarity.SIGNATURE_BYTES :].copy().view("S32")[:, 0]
    sample = np.argsort(content, kind="stable")[:SAMPLE]  # as Beam's sample: the smallest content hashes
    limits = similarity.thresholds(rows[sample])
    pairs = search(rows, content, limits, images)
    # Only the Metas of images in a pair are read back, from their batch's file.
    file_of = np.repeat(np.arange(len(paths)), [len(t) for t in tables])
    first_row = np.r_[0, np.cumsum([len(t) for t in tables])]
    metas: Dict[int, list] = {}
    for f in sorted({int(file_of[k]) for pair in pairs for k in pair}):
        fields = json.loads(fs.read_bytes(paths[f][: -len(".bin")] + ".json").decode("ascii"))
        for k in {k for pair in pairs for k in pair if file_of[k] == f}:
            metas[k] = fields[k - first_row[f]]
    return [(metas[i], metas[j]) for i, j in pairs]


def group(pairs: Sequence[Tuple[Meta, Meta]], removed: Iterable[str] = ()) -> List[List[Meta]]:
    """Connected groups of the pairs (union-find), then without the examples already removed (exact duplicates
    quarantined), those of two or more left; each group sorted by split then path, groups by their first member's
    path. The searches send a spanning set of pairs whose hubs differ (grouping.search joins a group
    through one image, Beam's way through each bucket's first path): a removed hub must not take its group's
    other pairs with it, so removal follows the grouping."""
    gone = set(removed)
    joined = Joined()
    metas: Dict[str, Meta] = {}
    for a, b in pairs:
        metas.update({a.rel_path: a, b.rel_path: b})
        joined.join(a.rel_path, b.rel_path)
    groups = collections.defaultdict(list)
    for path in metas:
        if path not in gone:
            groups[joined.root(path)].append(metas[path])
    return sorted(
        (sorted(g, key=lambda m: (split_sort_key(m.split), m.rel_path)) for g in groups.values() if len(g) > 1),
        key=lambda g: g[0].rel_path,
    )


# What decide() counts; None when the search is off (--near-duplicates off).
SEARCHED_FIGURES = (
    "near_duplicate_groups",
    "near_duplicate_files",
    "near_duplicate_eval_leaks",
    "near_duplicate_eval_leak_fraction",
    "near_duplicate_conflicts",
    "near_duplicate_within_class",
)


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
            rejected += [
                (
                    m,
                    bad_row(
                        m.rel_path,
                        Reason.NEAR_DUPLICATE,
                        f"near-duplicate of {kept.rel_path} ({kept.split}); kept there only",
                        m.label,
                        m.split,
                    ),
                )
                for m in g[1:]
            ]
    summary = {
        "near_duplicate_groups": len(groups),
        "near_duplicate_files": sum(len(g) for g in groups),
        # Eval examples with a near-duplicate in train (counted before any drop).
        "near_duplicate_eval_leaks": leaked,
        "near_duplicate_eval_leak_fraction": round(leaked / eval_examples, 6) if eval_examples else 0.0,
        "near_duplicate_conflicts": conflicts,
        "near_duplicate_within_class": sum(len({m.label for m in g}) == 1 for g in groups),
        # Shown first: conflicting labels, then copies across train and eval, then copies within a class.
        "near_duplicate_examples": [
            [[m.rel_path, m.label, m.split] for m in g]
            for g in sorted(groups, key=lambda g: (len({m.label for m in g}) == 1, len({m.split for m in g}) == 1))[
                :EXAMPLES_SHOWN
            ]
        ],
        "near_duplicates_dropped": len(rejected),
    }
    return summary, rejected


def csv_rows(groups: List[List[Meta]]) -> List[Dict[str, str]]:
    """near_duplicates.csv: a row per member, groups numbered from 1."""
    return [
        {"group": str(n), "path": m.rel_path, "label": m.label, "split": m.split}
        for n, g in enumerate(groups, start=1)
        for m in g
    ]
