"""image_check decides from bytes alone; its verdicts must agree with TensorFlow's decoder."""

import io
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import image_bytes
from PIL import Image

import stacks
from images.image_check import BadImage, Reason, check_image

BUDGET = 50_000_000


def _gif(frames=2) -> bytes:
    images = [Image.fromarray(np.full((30, 40, 3), 40 * i, np.uint8)) for i in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "GIF", save_all=True, append_images=images[1:])
    return out.getvalue()


def _png_with_transparency() -> bytes:
    image = Image.open(io.BytesIO(image_bytes("PNG"))).convert("P")
    image.info["transparency"] = 0
    out = io.BytesIO()
    image.save(out, "PNG", transparency=0)
    return out.getvalue()


GOOD = {
    "jpeg_rgb": (image_bytes("JPEG"), "jpeg", 3),
    "jpeg_gray": (image_bytes("JPEG", mode="L"), "jpeg", 1),
    "jpeg_cmyk": (image_bytes("JPEG", mode="CMYK"), "jpeg", 3),
    "jpeg_progressive": (image_bytes("JPEG", progressive=True), "jpeg", 3),
    "png_rgb": (image_bytes("PNG"), "png", 3),
    "png_gray": (image_bytes("PNG", mode="L"), "png", 1),
    "png_gray_alpha": (image_bytes("PNG", mode="LA"), "png", 2),
    "png_rgba": (image_bytes("PNG", mode="RGBA"), "png", 4),
    "png_palette": (image_bytes("PNG", mode="P"), "png", 3),
    "png_palette_transparent": (_png_with_transparency(), "png", 4),
    "png_16bit": (image_bytes("PNG", mode="I;16"), "png", 1),
    "gif_animated": (_gif(3), "gif", 3),
    "bmp_rgb": (image_bytes("BMP"), "bmp", 3),
    "bmp_rgba": (image_bytes("BMP", mode="RGBA"), "bmp", 4),
    "bmp_gray": (image_bytes("BMP", mode="L"), "bmp", 1),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_images_are_accepted_with_what_tensorflow_decodes(name):
    data, fmt, channels = GOOD[name]
    info = check_image(data, BUDGET)
    assert (info.format, info.height, info.width, info.channels) == (fmt, 30, 40, channels)
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert tuple(decoded.shape) == (info.height, info.width, info.channels)


def _png_bad_crc() -> bytes:
    data = bytearray(image_bytes("PNG"))
    ihdr_crc = 8 + 8 + 13  # signature, IHDR length+type, IHDR body
    data[ihdr_crc] ^= 0xFF
    return bytes(data)


def _bmp_palette_color() -> bytes:
    return image_bytes("BMP", mode="P")


def _tiff() -> bytes:
    return image_bytes("TIFF")


def _webp() -> bytes:
    return image_bytes("WEBP")


jpeg = image_bytes("JPEG", size=(64, 48))
BAD = {
    "empty": (b"", Reason.EMPTY),
    "text": (b"hello, I am a text file\n", Reason.NOT_AN_IMAGE),
    "html": (b"<!doctype html><html></html>", Reason.NOT_AN_IMAGE),
    "jpeg_truncated_half": (jpeg[: len(jpeg) // 2], Reason.TRUNCATED),
    "jpeg_truncated_end": (jpeg[:-2], Reason.TRUNCATED),
    "png_truncated": (image_bytes("PNG")[:200], Reason.TRUNCATED),
    "png_bad_crc": (_png_bad_crc(), Reason.CORRUPT),
    "jpeg_header_only": (jpeg[:20], Reason.CORRUPT),
    "tiff": (_tiff(), Reason.UNSUPPORTED),
    "webp": (_webp(), Reason.UNSUPPORTED),
    "bmp_1bit": (image_bytes("BMP", mode="1"), Reason.UNSUPPORTED),
    "bmp_palette": (_bmp_palette_color(), Reason.UNSUPPORTED),
    "bmp_trailing_bytes": (image_bytes("BMP") + b"\0\0", Reason.UNSUPPORTED),
    "bmp_truncated": (image_bytes("BMP")[:-10], Reason.TRUNCATED),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_get_a_reason(name):
    data, reason = BAD[name]
    with pytest.raises(BadImage) as caught:
        check_image(data, BUDGET)
    assert caught.value.reason == reason
    assert caught.value.detail  # a human explanation, not just a code


@pytest.mark.parametrize("name", sorted(n for n in BAD if n not in ("jpeg_truncated_end",)))
def test_what_we_reject_tensorflow_cannot_decode_correctly(name):
    data, _ = BAD[name]
    if name == "webp" and stacks.NAME == "modern":
        # TensorFlow 2.21 decodes WebP; ingestion and predict refuse it all the same, so that what one stack takes in,
        # a model pushed by the other still serves (TensorFlow 2.16 cannot decode it).
        assert tf.io.decode_image(data, channels=3).shape[-1] == 3
        return
    if name == "bmp_palette":
        # TF decodes it, but reads palette indices as gray levels: wrong pixels.
        decoded = tf.io.decode_image(data, channels=3).numpy()
        truth = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.abs(decoded.astype(int) - truth).max() > 50
        return
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        tf.io.decode_image(data, expand_animations=False)


def test_the_format_comes_from_content_not_extension():
    # A PNG saved with a .jpg name: tf.image.decode_jpeg would take it and mislabel the format.
    assert check_image(image_bytes("PNG"), BUDGET).format == "png"


def test_pixel_budget_guards_against_decompression_bombs():
    data = image_bytes("PNG", size=(200, 100))
    assert check_image(data, 20_000).width == 200
    with pytest.raises(BadImage) as caught:
        check_image(data, 19_999)
    assert caught.value.reason == Reason.TOO_MANY_PIXELS
    assert "200x100" in caught.value.detail and "19,999" in caught.value.detail


def test_gif_budget_counts_every_frame():
    with pytest.raises(BadImage) as caught:
        check_image(_gif(frames=4), 40 * 30 * 3)
    assert caught.value.reason == Reason.TOO_MANY_PIXELS and "4 frames" in caught.value.detail


def test_a_huge_declared_size_is_refused_before_decoding():
    # A PNG header claiming 100,000 x 100,000 pixels: refused from the header, nothing allocated.
    header = b"\x89PNG\r\n\x1a\n"
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    idat = zlib.compress(b"\0" * 100)
    chunk += struct.pack(">I", len(idat)) + b"IDAT" + idat + struct.pack(">I", zlib.crc32(b"IDAT" + idat))
    chunk += struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    with pytest.raises(BadImage) as caught:
        check_image(header + chunk, BUDGET)
    assert caught.value.reason == Reason.TOO_MANY_PIXELS


BOMBS = """
import resource, struct, zlib
from report.report_html import thumbnail

def png(width, height):
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = zlib.compress(bytes(width * 3 + 1) * 8)
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))

gif = (b"GIF89a" + struct.pack("<HH", 65535, 65535) + b"\\x00\\x00\\x00" + b"," + bytes(4)
       + struct.pack("<HH", 65535, 65535) + b"\\x00\\x02\\x02D\\x01\\x00;")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
found = [thumbnail(png(30000, 30000)), thumbnail(gif), thumbnail(png(64, 64)) is not None]
print(found, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_report_thumbnails_never_decode_a_decompression_bomb():
    """The report shows quarantined files as thumbnails: a 30000x30000 PNG of a few kB and a 29-byte GIF declaring
    65535x65535 were decoded (5.1 and 17.6 GB). They go through ingestion's pixel bound now: no thumbnail, and the
    process stays small; an ordinary image still gets one."""
    import subprocess
    import sys

    from pipeline.config import PROJECT_DIR

    done = subprocess.run([sys.executable, "-c", BOMBS], capture_output=True, text=True, cwd=PROJECT_DIR, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found, megabytes = done.stdout.strip().rsplit(" ", 1)
    assert found == "[None, None, True]"
    assert int(megabytes) < 100  # what the thumbnails added to the peak: 0 measured; either bomb takes gigabytes
