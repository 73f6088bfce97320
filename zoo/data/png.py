"""Write images as PNG with the standard library only (no Pillow needed)."""

import struct
import zlib

import numpy as np


def write_png(path, image):
    """Write ``image`` uint8 ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)`` to ``path`` as PNG."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"PNG pixels must be uint8, got {image.dtype}")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[..., 0]
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(f"image must be (H, W), (H, W, 1) or (H, W, 3), got {image.shape}")
    height, width = image.shape[:2]
    colour_type = 0 if image.ndim == 2 else 2  # grey or RGB
    rows = image.reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)  # filter type 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(_chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b""))


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def image_grid(images, columns=8, gap=2):
    """Tile float images ``(N, H, W, C)`` in [0, 1] into one uint8 image with ``gap``-pixel white lines."""
    images = np.clip(np.asarray(images, np.float32), 0.0, 1.0)
    count, height, width, channels = images.shape
    rows = -(-count // columns)
    grid = np.ones((rows * (height + gap) + gap, columns * (width + gap) + gap, channels), np.float32)
    for index, image in enumerate(images):
        top = gap + (index // columns) * (height + gap)
        left = gap + (index % columns) * (width + gap)
        grid[top : top + height, left : left + width] = image
    return (grid * 255).round().astype(np.uint8)
