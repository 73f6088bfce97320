"""Where a benchmark's markdown report goes besides stdout, and how its tables write sizes
(``zoo.units.format_bytes`` with the benchmarks' decimals)."""

import os

from zoo.units import format_bytes


def write_text(path, text):
    """Write a benchmark's table to ``path``, creating its folder."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")


def publish(text, settings, report):
    """A benchmark's markdown: reported (printed), and written to ``settings.output`` where given."""
    report(text)
    if settings.output:
        write_text(settings.output, text)


def size_text(nbytes):
    """Bytes as ``"5.24 GiB"`` (two decimals), ``"589.5 MiB"`` below 1 GiB, ``"1.9 KiB"`` below
    1 MiB (``"0.5 KiB"`` below 1 KiB): ``zoo.units.format_bytes`` as the benchmarks' tables write it."""
    return format_bytes(nbytes, 1, grouping=True, gib_decimals=2, smallest="KiB")


def mib_text(nbytes, gib_from=None):
    """Bytes as ``"589.5 MiB"`` (KiB below 1 MiB, so tiny test sizes still show a number;
    GiB from ``gib_from`` bytes where given), one decimal; ``"-"`` for None:
    ``zoo.units.format_bytes`` as the memory benchmarks' tables write it."""
    return format_bytes(nbytes, 1, grouping=True, gib_from=gib_from, smallest="KiB")


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
