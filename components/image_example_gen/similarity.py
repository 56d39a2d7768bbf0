"""Near-duplicate images: a perceptual signature per image at ingestion, and the test of two signatures.

A near-duplicate is a resized, recompressed, re-encoded or slightly cropped copy; distinct photos of
the same scene are not. An image's signature is taken from its centre at three scales (all of it,
92%, 84%), so that a copy cropped by a few percent a side lines up with one of the original's centre
crops; at each scale it holds ImageHash's pHash (DCT) and dHash (gradients), 64 bits each, and the
mean colour of a 4x4 grid. Two images are near-duplicates when, at some pair of their scales, the
pHashes and dHashes differ in at most a few bits (Limits) and the colour grids by at most
COLOUR_DIFFERENCE on average: the hashes see the structure in grey, the grid tells apart two
pictures on one background, and look-alike drawings. Measured on planted copies (resized to 50-80%,
recompressed at JPEG quality 40-70, cropped 3-6% a side; bench/health_benchmark.py): shapes on photo
backgrounds 98 of 100 found, no other image flagged; the digits 84 of 89 (0.4% others, look-alike
drawings of the set itself); photo crops 30 of 30.

The bit limits adapt to the data: drawn from a sample of the run's own signatures, they sit a few
standard deviations below the typical distance between two of its images (thresholds()), so a set of
look-alike images (small grayscale digits) gets stricter limits than a set of photos (which gets the
most, PHASH_BITS and DHASH_BITS).

Finding pairs without comparing every image with every other: each pHash is cut into BANDS bands of
bits (band_keys); images sharing a band value at any scale land in one bucket, and only the images of
a bucket are compared (pairs_in_bucket). The band width grows with the image count, so buckets stay
small.

No TensorFlow: ingestion's worker processes compute signatures.
"""

from typing import Iterator, List, NamedTuple, Sequence, Tuple

import imagehash
import numpy as np
from PIL import Image

SCALES = (1.0, 0.92, 0.84)
THUMB = 64  # the thumbnail the signature is taken from
GRID = 4  # the colour grid: GRID x GRID cells, RGB
PHASH_BITS, DHASH_BITS = 10, 14  # the most bits two near-duplicates' hashes may differ in (photos)
COLOUR_DIFFERENCE = 6.0  # the largest mean difference of their colour grids, of 255
HASH_BYTES = 16  # pHash and dHash, per scale
SCALE_BYTES = HASH_BYTES + GRID * GRID * 3
SIGNATURE_BYTES = len(SCALES) * SCALE_BYTES
BANDS = 8


class Limits(NamedTuple):
    phash_bits: int = PHASH_BITS
    dhash_bits: int = DHASH_BITS
    colour: float = COLOUR_DIFFERENCE


def signature(image: Image.Image) -> bytes:
    """Per scale: pHash, dHash (8 bytes each, big-endian), the colour grid (48 bytes): 192 bytes."""
    thumb = image.convert("RGB").resize((THUMB, THUMB), Image.BILINEAR)
    gray = thumb.convert("L")
    out = []
    for scale in SCALES:
        margin = int(round(THUMB * (1 - scale) / 2))
        box = (margin, margin, THUMB - margin, THUMB - margin)
        crop = gray.crop(box)
        for fn in (imagehash.phash, imagehash.dhash):
            out.append(np.packbits(fn(crop).hash.flatten()).tobytes())
        out.append(np.asarray(thumb.crop(box).resize((GRID, GRID), Image.BOX), np.uint8).tobytes())
    return b"".join(out)


def hashes_only(sig: bytes) -> bytes:
    """The pHash and dHash of each scale (48 bytes): what the example keeps as its perceptual hash."""
    return b"".join(sig[i * SCALE_BYTES:i * SCALE_BYTES + HASH_BYTES] for i in range(len(SCALES)))


def parse(signatures: Sequence[bytes]) -> Tuple[np.ndarray, np.ndarray]:
    """([n, scales, 2] uint64 pHash and dHash, [n, scales, 48] float32 colour grids)."""
    raw = np.frombuffer(b"".join(signatures), np.uint8).reshape(len(signatures), len(SCALES), SCALE_BYTES)
    hashes = raw[..., :HASH_BYTES].copy().view(">u8").astype(np.uint64)
    return hashes, raw[..., HASH_BYTES:].astype(np.float32)


_M1, _M2, _M4, _H01 = (np.uint64(m) for m in (0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F,
                                                0x0101010101010101))


def _bits(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 (a SWAR popcount: 2.7x a byte lookup table here; numpy < 2 has no bitwise_count)."""
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return ((x * _H01) >> np.uint64(56)).astype(np.int32)


def hash_distances(a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pHash bits, dHash bits, the scale pair) between every hash of a [n, scales, 2] and of b [m, scales, 2],
    at the scale pair whose pHashes agree best: three [n, m] arrays (the pair as i * len(SCALES) + j)."""
    pairs = len(SCALES) ** 2
    p = _bits(a[:, None, :, None, 0] ^ b[None, :, None, :, 0]).reshape(len(a), len(b), pairs)
    d = _bits(a[:, None, :, None, 1] ^ b[None, :, None, :, 1]).reshape(len(a), len(b), pairs)
    best = p.argmin(axis=-1)
    return (np.take_along_axis(p, best[..., None], -1)[..., 0], np.take_along_axis(d, best[..., None], -1)[..., 0],
            best)


def matches(a, b, limits: Limits) -> Tuple[np.ndarray, np.ndarray]:
    """Indices (into a, into b) of the near-duplicate pairs between two parsed sets of signatures: the hashes
    at every scale pair first, then the colour grids of the (image, image, scale pair) triples they pass."""
    (ha, ga), (hb, gb) = a, b
    p = _bits(ha[:, None, :, None, 0] ^ hb[None, :, None, :, 0]).reshape(len(ha), len(hb), -1)
    d = _bits(ha[:, None, :, None, 1] ^ hb[None, :, None, :, 1]).reshape(len(ha), len(hb), -1)
    i, j, pair = np.nonzero((p <= limits.phash_bits) & (d <= limits.dhash_bits))
    colour = np.abs(ga[i, pair // len(SCALES)] - gb[j, pair % len(SCALES)]).mean(axis=-1)
    keep = colour <= limits.colour
    found = np.unique(np.stack([i[keep], j[keep]], axis=1), axis=0).reshape(-1, 2)
    return found[:, 0], found[:, 1]


def thresholds(sample: Sequence[bytes]) -> Limits:
    """Bit limits for this data: PHASH_BITS and DHASH_BITS, or less where its images' typical distances
    are small (mean minus 4 and 3 standard deviations, from a sample), so that look-alike images are
    not taken for copies of each other."""
    if len(sample) < 50:
        return Limits()
    hashes = parse(sample)[0]
    p, d, _ = hash_distances(hashes, hashes)
    upper = np.triu_indices(len(sample), 1)
    p, d = p[upper], d[upper]
    return Limits(int(np.clip(p.mean() - 4 * p.std(), 2, PHASH_BITS)),
                  int(np.clip(d.mean() - 3 * d.std(), 2, DHASH_BITS)))


def band_width(images: int) -> int:
    """Bits per band: 8 up to ~16k images, then one more per doubling (16 at most), ~64 images a bucket."""
    return int(min(16, max(8, np.ceil(np.log2(max(images, 2))) - 6)))


def _band_bits(width: int) -> List[np.ndarray]:
    if width == 8:
        return [np.arange(8 * b, 8 * b + 8) for b in range(BANDS)]
    rng = np.random.default_rng(width)  # fixed: every worker cuts the same bands
    return [np.sort(rng.choice(64, width, replace=False)) for _ in range(BANDS)]


def band_keys(sig: bytes, width: int) -> List[Tuple[int, int]]:
    """(band, value) for each band of the pHash at each scale: the buckets the image goes into."""
    raw = np.frombuffer(sig, np.uint8).reshape(len(SCALES), SCALE_BYTES)[:, :8]
    bits = np.unpackbits(raw, axis=-1)
    keys = set()
    for band, chosen in enumerate(_band_bits(width)):
        weights = 1 << np.arange(len(chosen) - 1, -1, -1)
        for scale_bits in bits:
            keys.add((band, int(scale_bits[chosen] @ weights)))
    return sorted(keys)


def pairs_in_bucket(signatures: Sequence[bytes], limits: Limits) -> Iterator[Tuple[int, int]]:
    """Index pairs (i < j) of the near-duplicates among `signatures`, each pair once."""
    if len(signatures) < 2:
        return
    whole = parse(signatures)
    for start in range(0, len(signatures), 64):  # blocks: a bucket of thousands (blank images) stays bounded
        block = (whole[0][start:start + 64], whole[1][start:start + 64])
        for i, j in zip(*matches(block, whole, limits)):
            if start + i < j:
                yield start + int(i), int(j)
