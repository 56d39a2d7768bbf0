"""The stratified split of unsplit data: each class's eval share within one image of --eval-percent, still
decided by content hash, so that a rare class is never missing from eval (docs/data.md: Splits).

Within a class, files are ordered by their content hash (its first 64 bits as a fraction, `position`); the
first split (train) takes the first quota of them, the next split the next quota, and so on. The quotas are the
class's count times each split's share, rounded so that they add up and no split of a class with enough files
is empty (`quotas`). Identical bytes have one position, so they land in one split; a file added later takes its
place in the order and moves at most a neighbour across a boundary, so the splits stay stable as spans grow.

The order is only known once every file is read, but files are written as they are read. So the ingestion
workers write a file straight into its split when its position is far from the boundary for a class of that
size (`band`: five standard deviations of where the boundary can fall), and into PENDING staging shards when it
is near it; after the run, `assign` places the pending files by rank, and only those shards are rewritten. For a
class of 10,000 files the band holds ~3% of them; a class of a hundred is pending whole (it is small).
A multi-label file has a label set, not a class: it is stratified by its rarest label (the images of a common
label are spread over the strata of the rarer ones, each split by hash), and the files whose rarest label has
fewer than LabelStrata.smallest files, or no label, share one pooled stratum (a stratum of one or two files cannot
be split by a percentage: 500 labels on 60 images put none in eval). So each label's eval share follows
--eval-percent, within a file or two.

Plain Python: the workers import it.
"""

import collections
import math
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from images.finding.listing import labels_of

PENDING = "_pending"  # the staging split of files near a class's boundary, placed after the run
POOLED = "\0pooled"  # a multi-label stratum: the files whose rarest label is too rare to be split on its own
Z = 5.0  # the band's half-width in standard deviations of a class's boundary position


def position(sha256: str) -> float:
    """A file's place in its class's order: the first 64 bits of its content hash, as a fraction."""
    return int(sha256[:16], 16) / 2.0**64


def shares(buckets: Sequence[int]) -> List[float]:
    """Each hash split's share, from ImageExampleGen's cumulative hash buckets (e.g. [80, 100] -> [0.8, 0.2])."""
    total = buckets[-1]
    return [(b - a) / total for a, b in zip([0, *buckets[:-1]], buckets)]


def band(count: int, split_shares: Sequence[float]) -> Tuple[float, float]:
    """(lo, hi): a file of a class of `count` files at a position in [lo, hi) may land on either side of a
    boundary; below lo it is in the first split for certain, at or above hi in the last. Every boundary between
    the first and the last split lies inside (a middle split, in a three-way split, is pending whole)."""
    if len(split_shares) < 2 or count <= 0:
        return 0.0, 0.0
    cuts = [sum(split_shares[: i + 1]) for i in range(len(split_shares) - 1)]
    widths = [Z * math.sqrt(max(c * (1 - c), 1e-12) / count) + 2.0 / count for c in cuts]
    return max(0.0, cuts[0] - widths[0]), min(1.0, cuts[-1] + widths[-1])


def bands(counts: Dict[str, int], split_shares: Sequence[float]) -> Dict[str, Tuple[float, float]]:
    """The band of every class, from its number of hash-split files."""
    return {label: band(n, split_shares) for label, n in counts.items()}


def zone(sha256: str, names: Sequence[str], class_band: Optional[Tuple[float, float]]) -> str:
    """The split a worker writes a file of a class with this band to: a sure one, or PENDING."""
    if len(names) == 1:
        return names[0]
    lo, hi = class_band if class_band is not None else (0.0, 1.0)
    where = position(sha256)
    return names[0] if where < lo else names[-1] if where >= hi else PENDING


def quotas(count: int, split_shares: Sequence[float]) -> List[int]:
    """Files of a class per split: count * share rounded by largest remainder (each within one file of it, and
    adding up to count), then at least one in every split when the class has as many files as there are splits,
    taken from the split with the most."""
    exact = [count * s for s in split_shares]
    given = [math.floor(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: (given[i] - exact[i], i))[: count - sum(given)]:
        given[i] += 1
    if count >= len(split_shares):
        for i, n in enumerate(given):
            if n == 0 and split_shares[i] > 0:
                given[max(range(len(given)), key=lambda j: given[j])] -= 1
                given[i] += 1
    return given


def assign(
    names: Sequence[str],
    split_shares: Sequence[float],
    sure: Dict[str, Dict[str, int]],
    pending: Dict[str, List[Tuple[str, object]]],
) -> Tuple[Dict[object, str], List[str]]:
    """Places the pending files of each class by rank.

    sure: per class, the files already in the first and the last split (after any copy was rejected);
    pending: per class, (sha256, key) of each pending file that stays. Returns ({key: split}, notes): a note per
    class whose quota the sure files alone already overshoot (a file far outside its band: never seen at Z=5,
    but then the class's split is off by those files, and says so)."""
    placed: Dict[object, str] = {}
    notes = []
    for label in sorted(set(sure) | set(pending)):
        ordered = sorted(pending.get(label, []), key=lambda item: (position(item[0]), item[0]))
        low, high = sure.get(label, {}).get(names[0], 0), sure.get(label, {}).get(names[-1], 0)
        count = low + len(ordered) + high
        ends = [sum(quotas(count, split_shares)[: i + 1]) for i in range(len(names))]
        if low > ends[0] or count - high < ends[-2]:
            what = "the files of labels too rare to split alone" if label == POOLED else f"class {label!r}"
            notes.append(f"{what}: its split is off its quota by files far from the boundary")
        first_of: Dict[str, str] = {}  # identical bytes follow the first copy's split
        for offset, (sha, key) in enumerate(ordered):
            rank = low + offset
            split = names[next((j for j, end in enumerate(ends) if rank < end), len(names) - 1)]
            placed[key] = first_of.setdefault(sha, split)
    return placed, notes


class LabelStrata(NamedTuple):
    """How multi-label files are stratified: the hash-split files per label, and the fewest a label's stratum
    takes (twice the files that give the smallest split one)."""

    counts: Dict[str, int]
    smallest: int


def label_strata(label_sets: Iterable[str], split_shares: Sequence[float]) -> LabelStrata:
    """The strata of the hash-split files of a multi-label listing (their label sets)."""
    counts = collections.Counter(name for label in label_sets for name in labels_of(label))
    least = min((share for share in split_shares if share > 0), default=1.0)
    return LabelStrata(dict(counts), math.ceil(2 / least))


def stratum(label: str, strata: Optional[LabelStrata]) -> str:
    """The stratum a file is split in: its class, or (multi-label) its rarest label, or POOLED."""
    if strata is None:
        return label
    rarest = min(labels_of(label), key=lambda name: (strata.counts.get(name, 0), name), default=None)
    return rarest if rarest is not None and strata.counts.get(rarest, 0) >= strata.smallest else POOLED
