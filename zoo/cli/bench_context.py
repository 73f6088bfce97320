"""``zoo bench context``: flags for ``zoo.bench.context_parallel_memory``, and a standalone entry.

``add_arguments(parser)`` adds the benchmark's flags to a (sub)parser and ``run(args)``
runs it; ``python -m zoo.cli.bench_context`` does both on its own, with
``--simulate-devices``.
"""

import argparse
import dataclasses
import sys

from zoo.cli import _types as types


def _runs(text):
    runs = tuple(part.strip() for part in text.split(";") if part.strip())
    if not runs or any(":" not in run for run in runs):
        raise argparse.ArgumentTypeError(
            f"expected ';'-separated '<mesh>:<global batch>' runs such as 'data=8:8;data=1,seq=8:1', got {text!r}"
        )
    return runs


def _balance(text):
    return None if text == "none" else text


def add_arguments(parser):
    """Adds the benchmark's flags (defaults from ``BenchConfig``)."""
    from zoo.bench.context_parallel_memory import BenchConfig

    d = BenchConfig()
    parser.add_argument("--length", type=types.sequence_length, default=d.length, help=f"sequence length T (default {d.length})")
    parser.add_argument("--runs", type=_runs, default=d.runs, help=f"';'-separated '<mesh>:<global batch>' layouts; a mesh with a 'seq' axis is context-parallel (default {';'.join(d.runs)!r})")
    parser.add_argument("--layers", type=types.positive_int, default=d.layers, help=f"Transformer blocks L (default {d.layers})")
    parser.add_argument("--width", type=types.positive_int, default=d.width, help=f"model width C (default {d.width})")
    parser.add_argument("--heads", type=types.positive_int, default=d.heads, help=f"attention heads H = K (default {d.heads})")
    parser.add_argument("--head-dim", type=types.positive_int, default=d.head_dim, help=f"head dim D (default {d.head_dim})")
    parser.add_argument("--hidden-dim", type=types.positive_int, default=d.hidden_dim, help=f"MLP hidden features F (default {d.hidden_dim})")
    parser.add_argument("--vocab", type=types.positive_int, default=d.vocab, help=f"vocabulary size V (default {d.vocab})")
    parser.add_argument("--attention", choices=["ring", "gather", "ulysses"], default=d.attention, help=f"context-parallel attention kernel (default {d.attention})")
    parser.add_argument("--balance", type=_balance, choices=[None, "zigzag", "striped"], default=d.balance, help="causal load balancing: zigzag, striped or none (default zigzag)")
    parser.add_argument("--output", default=d.output, help="also write the markdown report to this file")


def config_from_args(args):
    from zoo.bench.context_parallel_memory import BenchConfig

    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{k: v for k, v in vars(args).items() if k in fields})


def run(args):
    """Runs the benchmark from parsed flags; returns the exit code (0: it ran, whatever the goal)."""
    from zoo.bench.context_parallel_memory import run_benchmark

    run_benchmark(config_from_args(args))
    return 0


def main(argv=None):
    from zoo.cli._errors import standalone_main

    return standalone_main("python -m zoo.cli.bench_context", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
