"""``zoo bench tp``: bytes moved by the explicit tensor-parallel MLP vs GSPMD vs Megatron's minimum.

Wire into ``zoo.cli.main`` with ``add_arguments(subparser)`` and ``run(args)``; this
module adds its own ``--simulate-devices`` (``main`` reads ``args.simulate_devices``
before JAX starts). The work is ``zoo.bench.tensor_parallel.run_benchmark``.
"""

import dataclasses

from zoo.cli import _types as types


def add_arguments(parser):
    """The ``zoo bench tp`` flags, on an ``argparse`` (sub)parser."""
    from zoo.bench.tensor_parallel import VARIANTS, BenchConfig

    defaults = BenchConfig()
    parser.add_argument("--simulate-devices", type=types.positive_int, default=None, metavar="N", help="split the CPU into N devices (default on a CPU-only host: 8)")
    parser.add_argument("--mesh", default=defaults.mesh, help=f"mesh with axes data and model (default {defaults.mesh})")
    parser.add_argument("--batch-size", type=types.positive_int, default=defaults.batch_size, help="global batch B")
    parser.add_argument("--seq-len", type=types.positive_int, default=defaults.seq_len, help="sequence length T")
    parser.add_argument("--dim", type=types.positive_int, default=defaults.dim, help="model width D")
    parser.add_argument("--hidden", type=types.positive_int, default=defaults.hidden, help="hidden features F")
    parser.add_argument("--steps", type=types.positive_int, default=defaults.steps, help="forward + backward passes per timed measurement")
    parser.add_argument("--repeats", type=types.positive_int, default=defaults.repeats, help="alternating measurements; the median is kept")
    parser.add_argument(
        "--variants", type=types.comma_separated(tuple(VARIANTS), "variant"), default=defaults.variants, help=f"comma-separated, of {','.join(VARIANTS)} (default all)"
    )
    parser.add_argument("--fast-compile", action="store_true", help="skip LLVM optimisation: same bytes and memory, times meaningless")
    parser.add_argument("--output", default=defaults.output, help="write the markdown table here too")


def run(args):
    """Run the benchmark ``args`` describe; returns the exit code."""
    from zoo.bench.tensor_parallel import BenchConfig, run_benchmark

    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    run_benchmark(BenchConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 0
