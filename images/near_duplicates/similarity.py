"""Near-duplicate images: a perceptual signature per image at ingestion, and the test of two signatures.

A near-duplicate is a resized, recompressed, re-encoded or slightly cropped copy; distinct photos of
the same scene are not. An image's signature is taken from its centre at three scales (all of it,
92%, 84%), so that a copy cropped by a few percent a side lines up with one of the original's centre
crops; at each scale it holds ImageHash's pHash (DCT) and dHash (gradients), 64 bits each, and the
mean colour of a 4x4 grid. Two images are near-duplicates when, at some pair of their scales, the
pHashes and dHashes differ in at most a few bits (NearDuplicateLimits) and the colour grids by at most
COLOUR_DIFFERENCE on average: the hashes see the structure in grey, the grid tells apart two
pictures on one background, and look-alike drawings. Measured on planted copies (resized to 50-80%,
recompressed at JPEG quality 40-70, cropped 3-6% a side; bench/health_benchmark.py): shapes on photo
backgrounds 98 of 100 found, no other image flagged; the digits 84 of 89 (0.4% others, look-alike
drawings of the set itself); photo crops 30 of 30.

The bit limits adapt to the data: drawn from a sample of the run's own signatures, they sit a few
standard deviations below the typical distance between two of its images (thresholds()), so a set of
look-alike images (small grayscale digits) gets stricter limits than a set of photos (which gets the
most, PHASH_BITS and DHASH_BITS).

Finding pairs without comparing every image with every other: each pHash is cut into bands of bits
(band_bits); images sharing a band value at any scale land in one bucket, and only the images of a bucket
are compared (near: the test, vectorised over arrays of pairs). Where the limits are strict (a set of
look-alikes), the bands are limit + 1 disjoint ones, and every pair within the limit shares a bucket;
otherwise BANDS bands whose width grows with the image count. The signature itself is made in
signature.py.

No TensorFlow: ingestion's worker processes read THUMB and DECODE_FLOOR.
"""

from typing import Iterator, List, NamedTuple, Tuple

import numpy as np

SCALES = (1.0, 0.92, 0.84)
THUMB = 64  # the thumbnail the signature is taken from (signature.py)
# A JPEG is decoded at 1/2, 1/4 or 1/8 of its side (libjpeg's DCT scaling), for the signature to no less than
# this: a 300-500 px photo at 1/8 (38-63 px) decodes in 2/3 of the time of 1/4. Any other image (a PNG copy of
# a JPEG) is box-reduced by the same factor before its thumbnail (image_check._at_signature_scale), so both
# thumbnails are made alike.
DECODE_FLOOR = 32
GRID = 4  # the colour grid: GRID x GRID cells, RGB
PHASH_BITS, DHASH_BITS = 10, 14  # the most bits two near-duplicates' hashes may differ in (photos)
COLOUR_DIFFERENCE = 6.0  # the largest mean difference of their colour grids, of 255
HASH_BYTES = 16  # pHash and dHash, per scale
SCALE_BYTES = HASH_BYTES + GRID * GRID * 3
SIGNATURE_BYTES = len(SCALES) * SCALE_BYTES
BANDS = 8


class NearDuplicateLimits(NamedTuple):
    phash_bits: int = PHASH_BITS
    dhash_bits: int = DHASH_BITS
    colour: float = COLOUR_DIFFERENCE


def hashes_only(sig: bytes) -> bytes:
    """The pHash and dHash of each scale (48 bytes): what the example keeps as its perceptual hash."""
    return b"".join(sig[i * SCALE_BYTES : i * SCALE_BYTES + HASH_BYTES] for i in range(len(SCALES)))


class Parsed(NamedTuple):
    """Signatures ready to compare: each hash bit as +1 or -1, so that a matrix product counts agreeing bits."""

    phash: np.ndarray  # [n, scales, 64] float32
    dhash: np.ndarray  # [n, scales, 64] float32
    grids: np.ndarray  # [n, scales, 48] float32 colour grids


def as_rows(signatures) -> np.ndarray:
    """[n, SIGNATURE_BYTES] uint8 from a sequence of signatures (bytes) or such an array."""
    if isinstance(signatures, np.ndarray):
        return signatures.reshape(len(signatures), SIGNATURE_BYTES)
    return np.frombuffer(b"".join(signatures), np.uint8).reshape(len(signatures), SIGNATURE_BYTES)


def parse(signatures) -> Parsed:
    raw = as_rows(signatures).reshape(-1, len(SCALES), SCALE_BYTES)
    signs = 1.0 - 2.0 * np.unpackbits(raw[..., :HASH_BYTES], axis=-1).astype(np.float32)  # [n, scales, 128]
    return Parsed(signs[..., :64], signs[..., 64:], raw[..., HASH_BYTES:].astype(np.float32))


def _bits_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[n, m, scales * scales] differing bits between every hash of a [n, scales, 64] and of b [m, scales, 64]
    (+1/-1 bits), at every scale pair (i * len(SCALES) + j): (64 - their dot product) / 2, one matrix product
    (exact: integers in float32), where XOR and a popcount in numpy took 4x as long."""
    k = len(SCALES)
    dots = a.reshape(-1, 64) @ b.reshape(-1, 64).T
    apart = ((64.0 - dots) * 0.5).astype(np.int32)
    return apart.reshape(len(a), k, len(b), k).transpose(0, 2, 1, 3).reshape(len(a), len(b), k * k)


def hash_distances(a: Parsed, b: Parsed) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pHash bits, dHash bits, the scale pair) between every signature of a and of b, at the scale pair whose
    pHashes agree best: three [n, m] arrays (the pair as i * len(SCALES) + j)."""
    p, d = _bits_apart(a.phash, b.phash), _bits_apart(a.dhash, b.dhash)
    best = p.argmin(axis=-1)
    return (
        np.take_along_axis(p, best[..., None], -1)[..., 0],
        np.take_along_axis(d, best[..., None], -1)[..., 0],
        best,
    )


def thresholds(sample) -> NearDuplicateLimits:
    """Bit limits for this data: PHASH_BITS and DHASH_BITS, or less where its images' typical distances
    are small (mean minus 4 and 3 standard deviations, from a sample), so that look-alike images are
    not taken for copies of each other."""
    if len(sample) < 50:
        return NearDuplicateLimits()
    parsed = parse(sample)
    p, d, _ = hash_distances(parsed, parsed)
    upper = np.triu_indices(len(sample), 1)
    p, d = p[upper], d[upper]
    return NearDuplicateLimits(
        int(np.clip(p.mean() - 4 * p.std(), 2, PHASH_BITS)), int(np.clip(d.mean() - 3 * d.std(), 2, DHASH_BITS))
    )


def band_width(images: int) -> int:
    """Bits per band of the LSH bands: 8 up to ~16k images, then one more per doubling (16 at most)."""
    return int(min(16, max(8, np.ceil(np.log2(max(images, 2))) - 6)))


def band_bits(limits: NearDuplicateLimits, images: int) -> List[np.ndarray]:
    """The pHash bits of each band. Where the data's limit is strict enough that limit + 1 disjoint bands are each
    as wide as the LSH bands for this many images would be, those (exact: two pHashes within the limit agree on
    at least one of them, by pigeonhole, so every such pair shares a bucket); else BANDS bands of band_width bits
    chosen at random (LSH: a pair near the limit may share none). Measured on the benchmark's look-alike photos
    (limit 2 bits): 3 bands of 21 bits hold 17x fewer pairs than 8 bands of 10 bits at 40,000 images."""
    width = band_width(images)
    if 64 // (limits.phash_bits + 1) >= width:
        edges = np.linspace(0, 64, limits.phash_bits + 2).round().astype(int)
        return [np.arange(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
    if width == 8:
        return [np.arange(8 * b, 8 * b + 8) for b in range(BANDS)]
    rng = np.random.default_rng(width)  # fixed: every worker cuts the same bands
    return [np.sort(rng.choice(64, width, replace=False)) for _ in range(BANDS)]


def band_codes(signatures, bands: List[np.ndarray]) -> np.ndarray:
    """[n, bands * scales] int64: the buckets each image goes into, as band << 40 | the band's value, for each band
    of its pHash at each scale (an image may repeat a bucket: its scales can agree on a band)."""
    raw = as_rows(signatures).reshape(-1, len(SCALES), SCALE_BYTES)[..., :8]
    bits = np.unpackbits(raw, axis=-1).astype(np.int64)  # [n, scales, 64]
    return np.concatenate(
        [
            (band << 40) + bits[..., chosen] @ (1 << np.arange(len(chosen) - 1, -1, -1))
            for band, chosen in enumerate(bands)
        ],
        axis=1,
    )


class Hashes(NamedTuple):
    """Signatures as the pair test reads them."""

    words: np.ndarray  # [n, scales, 2] uint64: pHash and dHash
    grids: np.ndarray  # [n, scales, 48] float32 colour grids


def hashes(signatures) -> Hashes:
    raw = as_rows(signatures).reshape(-1, len(SCALES), SCALE_BYTES)
    return Hashes(raw[..., :HASH_BYTES].copy().view(">u8").astype(np.uint64), raw[..., HASH_BYTES:].astype(np.float32))


_POPCOUNT16 = np.array([bin(v).count("1") for v in range(1 << 16)], np.uint8)


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64, through a table of 16-bit counts (numpy < 2 has no bitwise_count; a SWAR popcount
    in numpy took 4x as long)."""
    x = np.ascontiguousarray(x)
    return _POPCOUNT16[x.view(np.uint16)].reshape(*x.shape, 4).sum(axis=-1, dtype=np.int32)


def near(h: Hashes, i: np.ndarray, j: np.ndarray, limits: NearDuplicateLimits) -> np.ndarray:
    """[len(i)] bool: whether images i[k] and j[k] are near-duplicates: at some pair of their scales, pHashes within
    limits.phash_bits, dHashes within limits.dhash_bits and colour grids within limits.colour."""
    a, b = h.words[i], h.words[j]  # [m, scales, 2]
    rows, scale_a, scale_b = np.nonzero(_popcount(a[:, :, None, 0] ^ b[:, None, :, 0]) <= limits.phash_bits)
    passed = _popcount(a[rows, scale_a, 1] ^ b[rows, scale_b, 1]) <= limits.dhash_bits
    rows, scale_a, scale_b = rows[passed], scale_a[passed], scale_b[passed]
    colour = np.abs(h.grids[i[rows], scale_a] - h.grids[j[rows], scale_b]).mean(axis=-1)
    found = np.zeros(len(i), bool)
    found[rows[colour <= limits.colour]] = True
    return found


def near_in_group(
    parsed: Parsed, limits: NearDuplicateLimits, block: int = 64
) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The pairs (i < j) of near-duplicates among a group of signatures (a large bucket), the test of near() as
    matrix products: a block of rows' +1/-1 bits against all, for every scale pair at once (measured on the
    benchmark's 40,000 look-alike photos, whose buckets hold hundreds: 10.7 s against 46 s with near())."""
    n, k = len(parsed.grids), len(SCALES)
    phash, dhash = parsed.phash.reshape(-1, 64), parsed.dhash.reshape(-1, 64)
    for start in range(0, n, block):
        rows = slice(start * k, min(n, start + block) * k)
        passed = (phash[rows] @ phash.T >= 64 - 2 * limits.phash_bits) & (
            dhash[rows] @ dhash.T >= 64 - 2 * limits.dhash_bits
        )
        first, second = np.nonzero(passed)
        (i, scale_a), (j, scale_b) = np.divmod(first + start * k, k), np.divmod(second, k)
        later = i < j
        i, scale_a, j, scale_b = i[later], scale_a[later], j[later], scale_b[later]
        close = np.abs(parsed.grids[i, scale_a] - parsed.grids[j, scale_b]).mean(axis=-1) <= limits.colour
        yield i[close], j[close]


def buckets(codes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(bucket codes, images), sorted by bucket, each (bucket, image) once: the buckets of codes [n, k] from
    band_codes."""
    n, k = codes.shape
    flat, image = codes.ravel(), np.repeat(np.arange(n), k)
    order = np.lexsort((image, flat))
    flat, image = flat[order], image[order]
    once = np.r_[True, (flat[1:] != flat[:-1]) | (image[1:] != image[:-1])] if len(flat) else np.zeros(0, bool)
    return flat[once], image[once]


def bucket_candidates(
    flat: np.ndarray, image: np.ndarray, most: int = 1 << 18
) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Every pair of images that share a bucket (flat codes sorted, as buckets() gives them), in chunks of about
    `most` pairs (a pair in several buckets comes once from each)."""
    if len(flat) < 2:
        return
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])
    ends = np.repeat(np.r_[starts[1:], len(flat)], np.diff(np.r_[starts, len(flat)]))
    partners = ends - np.arange(len(flat)) - 1  # the images after each one in its bucket
    positions = np.flatnonzero(partners)
    total = np.cumsum(partners[positions])
    first = 0
    while first < len(positions):
        last = max(first + 1, int(np.searchsorted(total, (total[first - 1] if first else 0) + most, side="right")))
        chosen = positions[first:last]
        counts = partners[chosen]
        left = np.repeat(chosen, counts)
        right = left + 1 + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        yield image[left], image[right]
        first = last
