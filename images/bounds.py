"""The bounds on an image: its pixels (--max-pixels), its file's size, and the memory decoding takes at once.

No import here: the CLI reads MAX_PIXELS at start-up, and pipeline/config.py checks the machine has
decode_memory_bytes (--max-pixels).
"""

# width * height * frames; larger files are quarantined (decompression bombs). Ingestion's default (--max-pixels);
# prediction and review keep the bound.
MAX_PIXELS = 50_000_000


def max_file_bytes(max_pixels: int) -> int:
    """No image within the pixel budget is bigger: 4 bytes a pixel (32-bit BMP) plus headroom."""
    return int(max_pixels * 4 * 1.01) + (1 << 20)


# Decoding memory. Transform, the Evaluator and serving decode at most this many images at
# once (components/transform/preprocessing.py's map_fn), each at most max_pixels. A PNG, GIF or BMP decodes at
# full size: 3 bytes a pixel, then 12 more as float32 for the antialiased resize (JPEGs decode
# at a DCT scale and need far less).
DECODES_IN_FLIGHT = 4
DECODE_BYTES_PER_PIXEL = 16


def decode_memory_bytes(max_pixels: int) -> int:
    """The most memory decoding can take at once with images of up to max_pixels."""
    return DECODES_IN_FLIGHT * DECODE_BYTES_PER_PIXEL * max_pixels
