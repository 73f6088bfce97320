"""Byte units, and how a size is written in a report: ``KIB``, ``MIB``, ``GIB``,
``format_bytes`` (a size with its unit) and ``format_bytes_in`` (a number of one unit,
for a table column whose header names the unit).

The bottom of the import graph, like ``zoo/_compat.py``: it imports nothing (no zoo module,
no JAX), so every package, ``zoo.config`` and ``zoo.kernels`` included, may import it.
"""

__all__ = ["GIB", "KIB", "MIB", "format_bytes", "format_bytes_in"]

KIB = 2**10
MIB = 2**20
GIB = 2**30


def format_bytes(count, decimals=1, *, grouping=False, gib_decimals=None, gib_from=GIB, smallest="B"):
    """``count`` bytes in the largest unit that keeps the number >= 1 (GiB at most), with
    ``decimals`` decimals, and thousands grouped with commas where ``grouping``.

    ``format_bytes(12288) == "12.0 KiB"``, ``format_bytes(1536 * MIB, 2) == "1.50 GiB"``,
    ``format_bytes(1000 * MIB, 2, grouping=True) == "1,000.00 MiB"``, ``format_bytes(640) ==
    "640 B"``; ``"-"`` for None.

    The benchmarks' tables bend the rule three ways: ``gib_decimals``, the decimals of a
    size in GiB (default ``decimals``); ``gib_from``, the size from which it is written in
    GiB (default 1 GiB; None: MiB however large); ``smallest="KiB"``, a size below 1 KiB as
    a fraction of a KiB (``"0.5 KiB"``) instead of whole bytes.
    """
    if smallest not in ("B", "KiB"):
        raise ValueError(f"smallest unit {smallest!r} is neither 'B' nor 'KiB'")
    if count is None:
        return "-"
    for unit, size, start, places in (
        ("GiB", GIB, gib_from, decimals if gib_decimals is None else gib_decimals),
        ("MiB", MIB, MIB, decimals),
        ("KiB", KIB, KIB, decimals),
    ):
        if start is not None and abs(count) >= start:
            return f"{format_bytes_in(count, size, places, grouping=grouping)} {unit}"
    if smallest == "KiB":
        return f"{format_bytes_in(count, KIB, decimals, grouping=grouping)} KiB"
    return f"{count:{',' if grouping else ''}.0f} B"


def format_bytes_in(count, unit, decimals=1, *, grouping=False):
    """``count`` bytes as a number of ``unit`` (``KIB``, ``MIB``, ``GIB``) with ``decimals``
    decimals and no unit name, for a table column whose header names the unit:
    ``format_bytes_in(1536 * MIB, GIB, 2) == "1.50"``, ``format_bytes_in(1000 * MIB, MIB, 0,
    grouping=True) == "1,000"``; ``"-"`` for None."""
    if count is None:
        return "-"
    return f"{count / unit:{',' if grouping else ''}.{decimals}f}"
