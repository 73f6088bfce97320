"""Reading back a PNG the zoo wrote: its signature and size, from the IHDR chunk."""

import struct

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """``(width, height)`` in pixels; fails unless ``path`` is a PNG."""
    with open(path, "rb") as handle:
        head = handle.read(24)
    assert head[:8] == SIGNATURE, f"{path} is not a PNG: starts {head[:8]!r}"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])
