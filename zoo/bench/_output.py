"""Where a benchmark's markdown report goes besides stdout, and how its tables write sizes."""

import os

from zoo.units import GIB, KIB, MIB


def write_text(path, text):
    """Write a benchmark's table to ``path``, creating its folder."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")


def size_text(nbytes):
    """Bytes as ``"5.24 GiB"`` (two decimals), ``"589.5 MiB"`` below 1 GiB, ``"1.9 KiB"`` below 1 MiB."""
    if nbytes >= GIB:
        return f"{nbytes / GIB:,.2f} GiB"
    if nbytes >= MIB:
        return f"{nbytes / MIB:,.1f} MiB"
    return f"{nbytes / KIB:,.1f} KiB"


def mib_text(nbytes, gib_from=None):
    """Bytes as ``"589.5 MiB"`` (KiB below 1 MiB, so tiny test sizes still show a number;
    GiB from ``gib_from`` bytes where given), one decimal; ``"-"`` for None."""
    if nbytes is None:
        return "-"
    if gib_from is not None and nbytes >= gib_from:
        return f"{nbytes / GIB:,.1f} GiB"
    if nbytes < MIB:
        return f"{nbytes / KIB:,.1f} KiB"
    return f"{nbytes / MIB:,.1f} MiB"


def remat_warning(remats):
    """A warning for a memory table with remat rows when this XLA's CPU memory analysis
    does not show remat (JAX 0.10), else ""."""
    from zoo.measure.compiled_step import memory_analysis_reflects_remat

    if tuple(remats) == ("none",) or memory_analysis_reflects_remat():
        return ""
    return (
        " WARNING: this XLA's CPU memory analysis does not show remat (JAX 0.10; compiled_step.memory_analysis_reflects_remat):"
        " the remat rows' temporaries are those of remat none; use JAX >= 0.12."
    )
