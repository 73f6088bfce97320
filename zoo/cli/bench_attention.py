"""``zoo bench attention``: flags for ``zoo.bench.attention_memory``, and a standalone entry.

``add_arguments(parser)`` adds the benchmark's flags to a (sub)parser and ``run(args)``
runs it; ``python -m zoo.cli.bench_attention`` does both on its own, with
``--simulate-devices``.
"""

import dataclasses
import sys

from zoo.cli import _types as types


def _balance(text):
    return None if text == "none" else text


def add_arguments(parser):
    """Adds the benchmark's flags (defaults from ``BenchConfig``)."""
    from zoo.bench.attention_memory import BenchConfig

    d = BenchConfig()
    parser.add_argument("--lengths", type=types.positive_ints, default=d.lengths, help=f"sequence lengths T of the memory table, compiled only (default {_csv(d.lengths)})")
    parser.add_argument("--devices", type=types.positive_ints, default=d.devices, help=f"sizes N of the 'seq' mesh axis (default {_csv(d.devices)})")
    parser.add_argument("--heads", type=types.positive_int, default=d.heads, help=f"attention heads H = K (default {d.heads})")
    parser.add_argument("--head-dim", type=types.positive_int, default=d.head_dim, help=f"head dim D (default {d.head_dim})")
    parser.add_argument("--batch", type=types.positive_int, default=d.batch, help=f"batch size B (default {d.batch})")
    parser.add_argument("--non-causal", dest="causal", action="store_false", help="full attention instead of causal")
    parser.add_argument("--block-size", type=types.positive_int, default=d.block_size, help=f"ring tile edge (default {d.block_size})")
    parser.add_argument("--balance", type=_balance, choices=[None, "zigzag", "striped"], default=d.balance, help="ring load balancing: zigzag, striped or none (default zigzag)")
    parser.add_argument("--time-lengths", type=types.positive_ints, default=d.time_lengths, help=f"T timed for every strategy and N (default {_csv(d.time_lengths)})")
    parser.add_argument("--goal-length", type=types.positive_int, default=d.goal_length, help=f"T of the ring-vs-all-gather time goal (default {d.goal_length})")
    parser.add_argument("--goal-heads", type=types.positive_int, default=d.goal_heads, help=f"heads of that timing (default {d.goal_heads})")
    parser.add_argument("--goal-devices", type=types.positive_int, default=d.goal_devices, help=f"N of that timing (default {d.goal_devices})")
    parser.add_argument("--repeats", type=types.positive_int, default=d.repeats, help=f"timed runs per strategy, median kept (default {d.repeats})")
    parser.add_argument("--memory-limit-gib", type=types.positive_float, default=d.memory_limit_gib, help=f"skip timings needing more host memory (default {d.memory_limit_gib:g})")
    parser.add_argument("--output", default=d.output, help="also write the markdown report to this file")


def _csv(values):
    return ",".join(str(v) for v in values)


def config_from_args(args):
    from zoo.bench.attention_memory import BenchConfig

    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{k: v for k, v in vars(args).items() if k in fields})


def run(args):
    """Runs the benchmark from parsed flags; returns the exit code (0: it ran, whatever the goals)."""
    from zoo.bench.attention_memory import run_benchmark

    run_benchmark(config_from_args(args))
    return 0


def main(argv=None):
    from zoo.cli._errors import standalone_main

    return standalone_main("python -m zoo.cli.bench_attention", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
