"""Fields every ``zoo bench`` settings class shares (``zoo.config.bench_settings``,
``bench_moe_settings``, ``bench_peers_settings``): counts, the precision, the report and
plot files, separated lists. Pure Python (no JAX, no Keras)."""

import argparse

from zoo.config import choices, types
from zoo.config.schema import setting

OUTPUT_HELP = "also write the markdown report to this file"
PLOT_HELP = 'also draw {what} to this PNG (matplotlib: pip install "keras-zoo[plot]")'


def count(default, help):
    return setting(default, help, section="bench", parse=types.positive_int)


def precision():
    return setting(
        "mixed_bfloat16",
        "Keras dtype policy: mixed_bfloat16 (bf16 compute, float32 weights)",
        section="bench",
        choices=choices.PRECISIONS,
    )


def output():
    return setting(None, OUTPUT_HELP, section="bench", metavar="FILE")


def plot(what):
    return setting(None, PLOT_HELP.format(what=what), section="bench", metavar="PNG")


def separated(separator, what, example):
    """``"a;b"`` -> ``("a", "b")``: non-empty parts, stripped."""

    def parse(text):
        parts = tuple(part.strip() for part in text.split(separator) if part.strip())
        if not parts:
            raise argparse.ArgumentTypeError(f"expected {what} such as {example!r}, got {text!r}")
        return parts

    parse.__name__ = what
    return parse


def block_counts(text):
    """``"2,4"`` -> ``(2, 4)``; ``"none"`` -> ``()``: partial depths compiled besides the whole model."""
    return () if text.strip() == "none" else types.positive_ints(text)
