"""``zoo bench scale``: the real-size plan, compile-only (``zoo.bench.scale``).

Wire into ``zoo.cli.main`` with ``add_arguments(subparser)`` and ``run(args)``. The
benchmark starts one process per device count it needs (1 to 256 simulated CPU
devices), so it takes no ``--simulate-devices``.
"""

import dataclasses

from zoo.cli._types import comma_separated

SECTIONS = ("recipes", "attention", "fsdp+tp", "tp")


def add_arguments(parser):
    """The ``zoo bench scale`` flags, on an ``argparse`` (sub)parser."""
    from zoo.bench.scale import ScaleConfig

    d = ScaleConfig()
    parser.add_argument("--recipes", type=lambda text: tuple(text.split(",")), default=d.recipes, help="comma-separated recipe files whose step is compiled at full depth (default: every GPU/TPU pretrain_gpt recipe)")
    parser.add_argument("--sections", type=comma_separated(SECTIONS, "section"), default=d.sections, help=f"comma-separated tables to produce, of {','.join(SECTIONS)} (default all)")
    parser.add_argument("--fsdp-tp-meshes", type=lambda text: tuple(text.split(";")), default=d.fsdp_tp_meshes, help="';'-separated meshes of the fsdp+tp weights table (default data=16,model=4;data=64,model=4)")
    parser.add_argument("--output", default=d.output, help="write the markdown report here too")


def run(args):
    """Run the benchmark ``args`` describe; returns the exit code."""
    from zoo.bench.scale import ScaleConfig, run_benchmark

    fields = {f.name for f in dataclasses.fields(ScaleConfig)}
    rows = run_benchmark(ScaleConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None}))
    return 1 if any("error" in row for row in rows) else 0
