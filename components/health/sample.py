"""Which images DataHealth's label check holds: a sample of at most LABEL_CHECK_SAMPLE images, stratified by class,
chosen by content hash (the same images each run)."""

from typing import Any, Dict

# The label check's sample: ~100 MB of 1,280-value features (or ~60 MB of 32 px pixels), and k-fold fits of a few
# minutes at most; every class at least this many of its images (or all of them).
LABEL_CHECK_SAMPLE = 20_000
MIN_SAMPLED_PER_CLASS = 50


class Sample:
    """Per class the share that keeps LABEL_CHECK_SAMPLE images in all (a multi-label image: one share for all), an
    image kept when its content hash's position is under its share."""

    def __init__(self, counts: Dict[Any, int], multi_label: bool, most: int = LABEL_CHECK_SAMPLE):
        total = sum(counts.values())
        self.total = total
        if total <= most:
            self.shares: Dict[Any, float] = {}
            self.uniform = 1.0
        elif multi_label:
            self.shares, self.uniform = {}, most / total
        else:
            self.shares = {
                c: min(1.0, max(MIN_SAMPLED_PER_CLASS, most * n / total) / n) for c, n in counts.items() if n
            }
            self.uniform = 1.0

    @classmethod
    def nothing(cls) -> "Sample":
        """No image: no label check runs."""
        empty = cls({}, multi_label=True)
        empty.uniform = 0.0
        return empty

    def keeps(self, key: str, label: Any) -> bool:
        share = self.uniform if not self.shares else self.shares.get(label, 1.0)
        return share >= 1.0 or sample_position(key) < share


def sample_position(key: str) -> float:
    """Where an image falls in the sample's order: the content hash's second 64 bits (the first place it in its
    split, example_gen/splitting/stratify.py: a sample by those would hold the train split only)."""
    return int(key[16:32], 16) / 2.0**64
