"""Decides, from a file's bytes alone, whether TensorFlow will decode it.

The format comes from magic bytes, never from the extension. Every accepted file
is decoded (JPEGs at 1/8 scale, which still reads every entropy-coded byte and so
still catches truncation); a header-only check lets truncated files through.

The rules mirror what `tf.io.decode_image` in TF 2.16 accepts, so that nothing
accepted here can crash Transform later. Where TF is stricter than Pillow (PNG
chunk CRCs, BMP layouts) the extra checks are explicit below.

No TensorFlow import here on purpose: Beam workers import this module and TF's
import costs seconds per worker process.
"""

import dataclasses
import io
import re
import struct
import warnings
import zlib
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from PIL import Image

from images.bounds import max_file_bytes
from images.near_duplicates import signature, similarity

# Our own budget (open_bounded, --max-pixels) replaces Pillow's decompression-bomb check.
Image.MAX_IMAGE_PIXELS = None


class Reason:
    """Stable quarantine reason codes (written to quarantine.csv)."""

    EMPTY = "empty_file"
    UNREADABLE = "unreadable"
    MISSING_FILE = "missing_file"
    NOT_AN_IMAGE = "not_an_image"
    UNSUPPORTED = "unsupported_format"
    TRUNCATED = "truncated"
    CORRUPT = "corrupt"
    TOO_MANY_PIXELS = "too_many_pixels"
    FILE_TOO_LARGE = "file_too_large"
    OUTSIDE_ROOT = "outside_data_root"
    MISSING_LABEL = "missing_label"
    UNKNOWN_SPLIT = "unknown_split"
    LABEL_CONFLICT = "label_conflict"
    DUPLICATE_ACROSS_SPLITS = "duplicate_across_splits"
    DUPLICATE = "duplicate"
    NEAR_DUPLICATE = "near_duplicate"  # with --near-duplicates drop
    EXCLUDED_BY_REVIEW = "excluded_by_review"  # with --review: a person decided to leave the image out


def bad_row(rel_path: str, reason: str, detail: str, label=None, split=None) -> Dict[str, str]:
    """A row of quarantine.csv: the file, its Reason, what to do about it."""
    return {"path": rel_path, "reason": reason, "detail": detail, "label": label or "", "split": split or ""}


class BadImage(Exception):
    """A file that must be quarantined, with a reason code and a human detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageInfo:
    format: str  # "jpeg", "png", "gif" or "bmp"
    height: int
    width: int
    channels: int  # what tf.io.decode_image(channels=0) returns
    signature: bytes = b""  # perceptual hashes for near-duplicates (signature.py); ingestion's check only


# Formats we recognise but TensorFlow cannot decode: a clearer reason than
# "not an image" for the user who dropped a WebP or HEIC into the folder.
_UNSUPPORTED_MAGIC = (
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"8BPS", "PSD"),
    (0, b"\x00\x00\x01\x00", "ICO"),
    (0, b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (0, b"\xffO\xffQ", "JPEG 2000"),
    (0, b"%PDF", "PDF"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
    (0, b"qoif", "QOI"),
)
_ISO_BMFF_IMAGE_BRANDS = {
    b"heic": "HEIC",
    b"heix": "HEIC",
    b"hevc": "HEIC",
    b"mif1": "HEIF",
    b"msf1": "HEIF",
    b"avif": "AVIF",
    b"avis": "AVIF",
}


def check_file_size(size: int, max_pixels: int) -> None:
    """BadImage for a file bigger than any image within max_pixels can be: such a file is never read."""
    if size > max_file_bytes(max_pixels):
        raise BadImage(
            Reason.FILE_TOO_LARGE, f"{size:,} bytes: larger than any image within --max-pixels could be; not read"
        )


def sniff_format(data: bytes) -> str:
    """Returns the image format from magic bytes, or raises BadImage."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data.startswith(b"BM") and len(data) >= 18:
        dib_size = struct.unpack_from("<I", data, 14)[0]
        if dib_size in (12, 40, 52, 56, 64, 108, 124):
            return "bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise BadImage(Reason.UNSUPPORTED, "WebP image; the serving model decodes JPEG, PNG, GIF and BMP")
    if data[4:8] == b"ftyp" and data[8:12] in _ISO_BMFF_IMAGE_BRANDS:
        name = _ISO_BMFF_IMAGE_BRANDS[data[8:12]]
        raise BadImage(Reason.UNSUPPORTED, f"{name} image; TensorFlow decodes JPEG, PNG, GIF and BMP")
    for offset, magic, name in _UNSUPPORTED_MAGIC:
        if data[offset : offset + len(magic)] == magic:
            raise BadImage(Reason.UNSUPPORTED, f"{name} file; TensorFlow decodes JPEG, PNG, GIF and BMP")
    raise BadImage(Reason.NOT_AN_IMAGE, f"unrecognised content (starts with {data[:8]!r})")


def check_image(data: bytes, max_pixels: int) -> ImageInfo:
    """Validates `data` by decoding it; returns its format and geometry.

    Raises BadImage with a reason code for anything TensorFlow would not decode,
    and for images over `max_pixels` (width * height * frames).
    """
    return _decode(data, max_pixels, 0)[0]


def check_and_store(
    data: bytes, max_pixels: int, store_max_pixels: int, sign: bool = True
) -> Tuple[ImageInfo, bytes, ImageInfo]:
    """Validates `data` like check_image; returns (its info, with its perceptual signature when `sign`, the
    bytes to store, their info).

    The bytes to store are `data` itself, or for an image above store_max_pixels (> 0) a
    copy within it, aspect kept. A JPEG stays a JPEG (quality 95): libjpeg decodes it
    straight to the largest of 1/2, 1/4 or 1/8 of its side that fits (a 12 MP photo
    and a 2 MP budget give 1008x756), which needs no resampling and validates every
    byte as check_image's 1/8-scale decode does; only an image too large even at 1/8
    is resampled further. Other formats are resampled to fit and become PNG (lossless;
    an animation keeps its first frame, the one TensorFlow decodes). No EXIF
    orientation is applied, as TensorFlow applies none.
    """
    info, image = _decode(data, max_pixels, store_max_pixels, sign=sign)
    if image is None:
        return info, data, info
    size = image.size if image.size[0] * image.size[1] <= store_max_pixels else _fit(info, store_max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stored, stored_info = _encode_copy(image, info, size)
    except Exception as e:  # Pillow raises many types
        raise BadImage(Reason.CORRUPT, f"{info.format.upper()} does not decode ({e})") from None
    return info, stored, stored_info


def _fit(info: ImageInfo, max_pixels: int) -> Tuple[int, int]:
    """(width, height) of the largest copy within max_pixels, aspect kept."""
    scale = (max_pixels / (info.width * info.height)) ** 0.5
    return max(1, int(info.width * scale)), max(1, int(info.height * scale))


def _draft_size(width: int, height: int, floor: int = similarity.DECODE_FLOOR) -> Tuple[int, int]:
    """The size asked of a JPEG's DCT scaling: 1/8 of the side, not below `floor` (the signature's
    similarity.DECODE_FLOOR; 1 for the check alone)."""
    return min(width, max(floor, width // 8)), min(height, max(floor, height // 8))


def _signature_factor(width: int, height: int) -> int:
    """The factor (8, 4, 2 or 1) libjpeg's DCT scaling divides the side by for the signature's _draft_size
    (Pillow's JpegImageFile.draft picks it so)."""
    target = _draft_size(width, height)
    fits = min(width // target[0], height // target[1])
    return next(k for k in (8, 4, 2, 1) if fits >= k)


def _at_signature_scale(image: Image.Image, width: int, height: int) -> Image.Image:
    """The image as a 1/8-scale JPEG decode sees it, whatever its format: DCT scaling keeps about each 8x8
    block's average, so a PNG (or a JPEG decoded larger, for its stored copy) is box-reduced by the same factor.
    Its signature then matches a JPEG copy's (tests/test_data_health.py)."""
    factor = max(1, round(_signature_factor(width, height) * image.size[0] / width))  # of what draft left
    if factor == 1:
        return image
    return (image if image.mode == "RGB" else image.convert("RGB")).reduce(factor)


def _dct_size(info: ImageInfo, max_pixels: int) -> Tuple[int, int]:
    """The size of the largest JPEG DCT scale-down (1/2, 1/4, 1/8) within max_pixels (else 1/8)."""
    for denominator in (2, 4, 8):
        size = (-(-info.width // denominator), -(-info.height // denominator))
        if size[0] * size[1] <= max_pixels:
            break
    return size


def open_bounded(data: bytes, max_pixels: int, fmt: Optional[str] = None) -> Image.Image:
    """The image opened (its header read, nothing decoded yet), or BadImage when its size times its frames is over
    max_pixels: the one pixel bound every decode of a file goes through (ingestion, predict's input check, the
    report's thumbnails), where Pillow's own decompression-bomb guard is off (it would refuse what --max-pixels
    allows)."""
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    frames = getattr(image, "n_frames", 1) if (fmt or sniff_format(data)) == "gif" else 1
    if width <= 0 or height <= 0:
        raise BadImage(Reason.CORRUPT, f"invalid size {width}x{height}")
    pixels = width * height * frames
    if pixels > max_pixels:
        raise BadImage(
            Reason.TOO_MANY_PIXELS,
            f"{width}x{height}"
            + (f"x{frames} frames" if frames > 1 else "")
            + f" = {pixels:,} pixels, over the budget of {max_pixels:,} (--max-pixels)",
        )
    return image


def thumbnail(data: bytes, size: int, max_pixels: int, fmt: str = "PNG") -> Optional[bytes]:
    """The image at most `size` a side, encoded as `fmt`, or None when it does not decode or is over the pixel
    bound (open_bounded: a quarantined decompression bomb is never decoded): the report's and the review page's."""
    try:
        with open_bounded(data, max_pixels) as image:
            image.draft("RGB", (size * 2, size * 2))
            image = image.convert("RGB")
            image.thumbnail((size, size))
            out = io.BytesIO()
            image.save(out, fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    except Exception:  # noqa: BLE001 - a quarantined or damaged file may not decode at all
        return None
    return out.getvalue()


def _decode(
    data: bytes, max_pixels: int, store_max_pixels: int, sign: bool = False
) -> Tuple[ImageInfo, Optional[Image.Image]]:
    """Decodes `data` (checks first); returns its info (with its perceptual signature when `sign`) and,
    when a stored copy is due, the image."""
    if not data:
        raise BadImage(Reason.EMPTY, "file is empty (0 bytes)")
    fmt = sniff_format(data)
    bmp_channels = _check_bmp_layout(data) if fmt == "bmp" else None
    if fmt == "png":
        _check_png_chunks(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = open_bounded(data, max_pixels, fmt)
            width, height = image.size
            info = ImageInfo(format=fmt, height=height, width=width, channels=bmp_channels or _tf_channels(fmt, image))
            copy_due = bool(store_max_pixels) and width * height > store_max_pixels
            if fmt == "jpeg":
                # Every 8x8 block takes at least one bit of entropy-coded data (its DC code), so fewer
                # bytes than that cannot be the whole image: a header that declares a large image
                # over the data of a small one, which libjpeg fills with grey, warning only. Only scan
                # data counts: comment segments or bytes after the end marker hold no pixels.
                blocks = -(-width // 8) * -(-height // 8)
                coded = jpeg_scan_bytes(data)
                if coded * 8 < blocks:
                    raise BadImage(
                        Reason.TRUNCATED,
                        f"{coded:,} bytes of image data cannot hold a {width}x{height} "
                        f"JPEG (at least {-(-blocks // 8):,} for its 8x8 blocks): the image data ends early",
                    )
                # DCT-domain downscaling still decodes every coefficient (and so catches truncation):
                # to 1/8 of the side for the check alone (but not below similarity.DECODE_FLOOR for the
                # signature), or to the scale of the stored copy.
                target = (
                    _dct_size(info, store_max_pixels)
                    if copy_due
                    else _draft_size(width, height, similarity.DECODE_FLOOR if sign else 1)
                )
                image.draft(image.mode, target)
            image.load()
            if sign:
                info = dataclasses.replace(info, signature=_signature(_at_signature_scale(image, width, height)))
    except BadImage:
        raise
    except Exception as e:  # Pillow raises many types (OSError, SyntaxError, ValueError, ...)
        # Pillow names the in-memory file it read ("<_io.BytesIO object at 0x...>"): say "the data".
        message = re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "the data", str(e)) or type(e).__name__
        if "truncated" in message.lower() or isinstance(e, EOFError):
            raise BadImage(Reason.TRUNCATED, f"{fmt.upper()} data ends early ({message})") from None
        raise BadImage(Reason.CORRUPT, f"{fmt.upper()} does not decode ({message})") from None
    return info, image if copy_due else None


# A marker inside entropy-coded data: 0xFF then a byte that is not a stuffed zero, a restart marker
# (D0-D7, part of the scan) or another 0xFF (fill).
_SCAN_END = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")


def jpeg_scan_bytes(data: bytes) -> int:
    """The bytes of entropy-coded (pixel) data in a JPEG, summed over its scans: its segments walked from
    SOI to EOI, each scan measured up to the next marker with a C-speed search."""
    pos, total, end = 2, 0, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker == 0xD9:  # EOI
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            pos += 2
            continue
        segment_end = pos + 2 + struct.unpack_from(">H", data, pos + 2)[0]
        if marker != 0xDA:  # not SOS: a header, table or comment segment
            pos = segment_end
            continue
        found = _SCAN_END.search(data, segment_end)
        pos = found.start() if found else end
        total += max(0, pos - segment_end)
    return total


def _signature(image: Image.Image) -> bytes:
    """The image's perceptual signature, or b"" (no near-duplicate check) for a mode hashing cannot take:
    a valid image is never quarantined for its signature."""
    try:
        return signature.signature(image)
    except Exception:  # noqa: BLE001 - Pillow's conversions raise many types
        return b""


def _encode_copy(image: Image.Image, info: ImageInfo, size: Tuple[int, int]) -> Tuple[bytes, ImageInfo]:
    if image.mode in ("I", "F") or image.mode.startswith("I;"):  # 16-bit: to 8 bits, as TensorFlow does
        image = image.convert("I").point(lambda v: v / 257).convert("L")
    keep = ("L", "RGB") if info.format == "jpeg" else ("L", "LA", "RGB", "RGBA")
    if image.mode not in keep:
        image = image.convert("RGBA" if "A" in image.mode or "transparency" in image.info else "RGB")
    if image.size != size:  # bilinear, with Pillow's support scaling (it antialiases)
        image = image.resize(size, Image.BILINEAR)
    out = io.BytesIO()
    if info.format == "jpeg":
        image.save(out, "JPEG", quality=95)
        fmt = "jpeg"
    else:
        image.save(out, "PNG", compress_level=1)  # fast: deflate's best levels buy little on photos
        fmt = "png"
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[image.mode]
    return out.getvalue(), ImageInfo(format=fmt, height=size[1], width=size[0], channels=channels)


def _tf_channels(fmt: str, image: Image.Image) -> int:
    """Channel count of tf.io.decode_image(channels=0) for this image (measured on TF 2.16)."""
    mode = image.mode
    if fmt == "gif":
        return 3
    if fmt == "jpeg":
        return 1 if mode == "L" else 3
    # PNG: libpng expands palettes and turns a tRNS chunk into an alpha channel.
    has_alpha_chunk = "transparency" in image.info
    if mode in ("1", "L", "I", "I;16", "I;16B"):
        return 2 if has_alpha_chunk else 1
    if mode == "LA":
        return 2
    if mode == "RGBA":
        return 4
    if mode in ("RGB", "P"):
        return 4 if has_alpha_chunk else 3
    return 3


def _check_png_chunks(data: bytes) -> None:
    """Walks the PNG chunks and checks their CRCs: libpng (in TF) rejects a bad CRC, Pillow does not."""
    pos = 8
    end = len(data)
    while pos + 8 <= end:
        length, ctype = struct.unpack_from(">I4s", data, pos)
        body_end = pos + 8 + length
        if body_end + 4 > end:
            raise BadImage(Reason.TRUNCATED, f"PNG data ends inside chunk {ctype!r}")
        crc = struct.unpack_from(">I", data, body_end)[0]
        if zlib.crc32(data[pos + 4 : body_end]) != crc:
            raise BadImage(Reason.CORRUPT, f"PNG chunk {ctype.decode('latin-1')!r} fails its CRC check")
        if ctype == b"IEND":
            return
        pos = body_end + 4
    raise BadImage(Reason.TRUNCATED, "PNG data ends before the IEND chunk")


def _check_bmp_layout(data: bytes) -> int:
    """TF 2.16's BMP decoder reads raw 8/24/32-bit rows and needs the exact file size.

    Returns the channels TF decodes (bits per pixel / 8; Pillow reads 32-bit BMPs as RGB).
    """
    if len(data) < 30:
        raise BadImage(Reason.TRUNCATED, "BMP header is incomplete")
    pixel_offset = struct.unpack_from("<I", data, 10)[0]
    dib_size = struct.unpack_from("<I", data, 14)[0]
    if dib_size == 12:
        raise BadImage(Reason.UNSUPPORTED, "OS/2 BMP; TensorFlow decodes Windows BMPs only")
    if len(data) < 54:
        raise BadImage(Reason.TRUNCATED, "BMP header is incomplete")
    width, height, _planes, bpp, compression = struct.unpack_from("<iiHHI", data, 18)
    if bpp not in (8, 24, 32):
        raise BadImage(Reason.UNSUPPORTED, f"{bpp}-bit BMP; TensorFlow decodes 8-, 24- and 32-bit BMPs")
    if compression != 0:
        raise BadImage(
            Reason.UNSUPPORTED, f"compressed BMP (compression={compression}); TensorFlow reads uncompressed BMPs"
        )
    if width <= 0 or height == 0:
        raise BadImage(Reason.CORRUPT, f"invalid BMP size {width}x{height}")
    if bpp == 8:
        # TF ignores the palette and reads indices as gray levels: only a gray ramp is safe.
        palette = data[14 + dib_size : pixel_offset]
        entries = [palette[i : i + 3] for i in range(0, min(len(palette), 1024) - 3, 4)]
        if any(e != bytes((i, i, i)) for i, e in enumerate(entries)):
            raise BadImage(Reason.UNSUPPORTED, "8-bit colour-palette BMP; TensorFlow would read it as grayscale")
    row_size = (bpp * width + 31) // 32 * 4
    expected = pixel_offset + row_size * abs(height)
    if len(data) < expected:
        raise BadImage(Reason.TRUNCATED, f"BMP has {len(data):,} bytes, needs {expected:,}")
    if len(data) > expected:
        raise BadImage(
            Reason.UNSUPPORTED,
            f"BMP has {len(data) - expected:,} bytes after the pixel data, which TensorFlow's decoder rejects",
        )
    return bpp // 8
