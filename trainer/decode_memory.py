"""The memory that decoding images takes: what Transform, the Evaluator and serving decode at once, and what
pipeline/config.py checks the machine has (--max-pixels)."""

# Decoding memory. Transform, the Evaluator and serving decode at most this many images at
# once (components/transform/preprocessing.py's map_fn), each at most max_pixels. A PNG, GIF or BMP decodes at
# full size: 3 bytes a pixel, then 12 more as float32 for the antialiased resize (JPEGs decode
# at a DCT scale and need far less).
DECODES_IN_FLIGHT = 4
DECODE_BYTES_PER_PIXEL = 16


def decode_memory_bytes(max_pixels: int) -> int:
    """The most memory decoding can take at once with images of up to max_pixels."""
    return DECODES_IN_FLIGHT * DECODE_BYTES_PER_PIXEL * max_pixels
