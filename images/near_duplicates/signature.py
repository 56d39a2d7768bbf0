"""An image's perceptual signature (what similarity.py compares): ImageHash's pHash and dHash and a colour grid of
the image's centre at three scales, computed as small matrix products.

ImageHash computes each hash with Pillow resizes (ten per image here) and scipy: ~1 ms an image, twice the
1/8-scale decode ingestion does anyway. Here the thumbnail is made once by Pillow (thumbnail()), and every crop's
resizes, the DCT and the grids are matrix products with Pillow's own fixed-point resampling weights and its
rounding after each pass, for the three crops at once: ~0.13 ms an image (signatures() takes many, but ingestion
signs each image alone: batches of 8-64 were no faster in a worker and took 4-40 MB more). The same bits as
ImageHash's calls: none of 230,400 differed on 600 photos, and the colour grids are Pillow's to the unit
(tests/test_data_health.py).

No TensorFlow: ingestion's worker processes compute signatures.
"""

from typing import List, NamedTuple, Sequence

import numpy as np
from PIL import Image

from images.near_duplicates.similarity import GRID, SCALES, THUMB

THUMBNAIL_BYTES = THUMB * THUMB * 4  # the thumbnail in grey, then in RGB


def signature(image: Image.Image) -> bytes:
    """The image's signature (signatures() of its thumbnail)."""
    return signatures([thumbnail(image)])[0]


def thumbnail(image: Image.Image) -> bytes:
    """The image's THUMB x THUMB thumbnail (Pillow's bilinear resize), in grey then in RGB: what signatures()
    takes."""
    thumb = (image if image.mode == "RGB" else image.convert("RGB")).resize((THUMB, THUMB), Image.BILINEAR)
    return thumb.convert("L").tobytes() + thumb.tobytes()


def signatures(thumbnails: Sequence[bytes]) -> List[bytes]:
    """Per thumbnail, per scale: pHash, dHash (8 bytes each, big-endian), the colour grid (48 bytes): 192 bytes.

    ImageHash's definitions: phash, the crop resized to 32x32 with Lanczos, the top-left 8x8 of its 2-D DCT-II
    against their median; dhash, the crop resized to 9x8, each pixel against its left neighbour; the grid, the
    RGB crop box-resized to 4x4. The thumbnails go through each step at once, each pass one matrix product."""
    if not thumbnails:
        return []
    n, w = len(thumbnails), _weights()
    raw = np.frombuffer(b"".join(thumbnails), np.uint8).reshape(n, THUMBNAIL_BYTES).astype(np.float64)
    # Each pass is one matrix product over every row of every thumbnail (numpy's stacked products were slower).
    gray = raw[:, : THUMB * THUMB].reshape(n * THUMB, THUMB)  # [n * 64 rows, 64 columns]
    rgb = raw[:, THUMB * THUMB :].reshape(n * THUMB, THUMB * 3)  # [n * 64 rows, 64 columns * 3 channels]
    # Horizontal passes of every crop's resizes at once, then each crop's vertical pass (rows of zeros outside it).
    across = _round(gray @ w.columns).reshape(n, THUMB, -1)  # [n, 64, 3 * (32 + 9)]
    phash_rows = across[..., : 3 * 32].reshape(n, THUMB, 3, 32).transpose(0, 2, 1, 3)  # [n, 3, 64, 32]
    dhash_rows = across[..., 3 * 32 :].reshape(n, THUMB, 3, 9).transpose(0, 2, 1, 3)  # [n, 3, 64, 9]
    dct = _DCT8 @ _round(w.rows32 @ phash_rows) @ _DCT8.T  # [n, 3, 8, 8]: the low 8x8 of scipy.fftpack.dct twice
    # A flat image's (or a one-way gradient's) other coefficients are 0 but for floating-point noise, which would
    # set their bits at random (ImageHash's own do): rounded, they are 0 and never above the median.
    flat = np.round(dct, 6).reshape(n, 3, 64)
    middle = np.sort(flat, axis=-1)[..., 31:33].mean(axis=-1, keepdims=True)  # numpy.median's value, faster
    phash = flat > middle
    small = _round(w.rows8 @ dhash_rows)  # [n, 3, 8, 9]
    dhash = (small[..., 1:] > small[..., :-1]).reshape(n, 3, 64)
    boxed = _round(rgb @ w.grid_columns_rgb).reshape(n, THUMB, 3, GRID, 3)  # [n, 64, crop, 4, channel]
    by_crop = boxed.transpose(0, 2, 1, 3, 4).reshape(n, 3, THUMB, GRID * 3)  # [n, crop, 64, 4 * channel]
    grid = _round(w.grid_rows @ by_crop)  # [n, crop, y, x * channel]
    grid = grid.astype(np.uint8).reshape(n, 3, GRID * GRID * 3)
    hashes = np.packbits(np.concatenate([phash, dhash], axis=-1), axis=-1)  # [n, 3, 16]
    rows = np.concatenate([hashes, grid], axis=-1).reshape(n, -1)
    return [row.tobytes() for row in rows]


# Pillow's 8-bit resampling is in fixed point: integer weights of 22 fractional bits, and each pass's sum, plus
# one half, shifted back and clipped (Resample.c: normalize_coeffs_8bpc, clip8). Done here with the same integer
# weights, every sum is an integer below 2**53, exact in float64 whatever order BLAS adds it in: a signature is
# the same alone or in any batch, on any CPU.
_PRECISION = float(1 << 22)


def _fixed(weights: np.ndarray) -> np.ndarray:
    """Pillow's integer weights (C's (int) truncates toward zero), as float64."""
    return np.trunc(weights * _PRECISION + np.where(weights < 0, -0.5, 0.5))


def _round(sums: np.ndarray) -> np.ndarray:
    """What Pillow's 8-bit resize pass stores from sums of pixels times integer weights."""
    return np.clip(np.floor((sums + _PRECISION / 2) / _PRECISION), 0, 255)


class _Matrices(NamedTuple):
    columns: np.ndarray  # [64, 3 * 32 + 3 * 9]: each crop's horizontal pass to 32 and to 9 columns
    rows32: np.ndarray  # [3, 32, 64]: each crop's vertical pass to 32 rows
    rows8: np.ndarray  # [3, 8, 64]
    grid_columns_rgb: np.ndarray  # [64 * 3, 3 * 4 * 3]: the colour grid's box passes, each channel on its own
    grid_rows: np.ndarray  # [3, 4, 64]


def _crop_weights(new: int, kernel, support: float) -> np.ndarray:
    """[3, new, 64]: for each crop of the thumbnail, Pillow's integer resampling weights from the thumbnail's
    pixels."""
    out = np.zeros((len(SCALES), new, THUMB))
    for s, scale in enumerate(SCALES):
        margin = int(round(THUMB * (1 - scale) / 2))
        out[s, :, margin : THUMB - margin] = _fixed(_pillow_weights(THUMB - 2 * margin, new, support, kernel))
    return out


def _pillow_weights(size: int, new: int, support: float, kernel) -> np.ndarray:
    """[new, size]: Pillow's resampling weights (precompute_coeffs in its Resample.c) for a kernel of this support."""
    scale = size / new
    stretch = max(scale, 1.0)
    reach = support * stretch
    weights = np.zeros((new, size))
    for i in range(new):
        centre = (i + 0.5) * scale
        first, last = max(int(centre - reach + 0.5), 0), min(int(centre + reach + 0.5), size)
        taps = kernel((np.arange(first, last) - centre + 0.5) / stretch)
        weights[i, first:last] = taps / taps.sum()
    return weights


def _lanczos(x: np.ndarray) -> np.ndarray:
    return np.where((x >= -3.0) & (x < 3.0), np.sinc(x) * np.sinc(x / 3.0), 0.0)


def _box(x: np.ndarray) -> np.ndarray:
    return ((x > -0.5) & (x <= 0.5)).astype(np.float64)


_MATRICES: list = []


def _weights() -> _Matrices:
    if not _MATRICES:
        lanczos32, lanczos9 = _crop_weights(32, _lanczos, 3.0), _crop_weights(9, _lanczos, 3.0)
        box = _crop_weights(GRID, _box, 0.5)
        _MATRICES.append(
            _Matrices(
                columns=np.concatenate(
                    [lanczos32.transpose(2, 0, 1).reshape(THUMB, -1), lanczos9.transpose(2, 0, 1).reshape(THUMB, -1)],
                    axis=1,
                ),
                rows32=lanczos32,
                rows8=_crop_weights(8, _lanczos, 3.0),
                grid_columns_rgb=np.kron(box.transpose(2, 0, 1).reshape(THUMB, -1), np.eye(3)),
                grid_rows=box,
            )
        )
    return _MATRICES[0]


# scipy.fftpack.dct (type II, unnormalised) of 32 values, its first 8 coefficients: 2 cos(pi k (2n + 1) / 64).
_DCT8 = 2 * np.cos(np.pi * np.arange(8)[:, None] * (2 * np.arange(32)[None, :] + 1) / 64)
