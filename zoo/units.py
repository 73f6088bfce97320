"""Byte units, and how a size is written in a report: ``KIB``, ``MIB``, ``GIB``, ``format_bytes``.

The bottom of the import graph, like ``zoo/_compat.py``: it imports nothing (no zoo module,
no JAX), so every package, ``zoo.config`` and ``zoo.kernels`` included, may import it.
"""

__all__ = ["GIB", "KIB", "MIB", "format_bytes"]

KIB = 2**10
MIB = 2**20
GIB = 2**30


def format_bytes(count, decimals=1, *, grouping=False):
    """``count`` bytes in the largest unit that keeps the number >= 1 (GiB at most), with
    ``decimals`` decimals, and thousands grouped with commas where ``grouping``.

    ``format_bytes(12288) == "12.0 KiB"``, ``format_bytes(1536 * MIB, 2) == "1.50 GiB"``,
    ``format_bytes(1000 * MIB, 2, grouping=True) == "1,000.00 MiB"``, ``format_bytes(640) ==
    "640 B"``; ``"-"`` for None.
    """
    if count is None:
        return "-"
    comma = "," if grouping else ""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(count) >= size:
            return f"{count / size:{comma}.{decimals}f} {unit}"
    return f"{count:{comma}.0f} B"
