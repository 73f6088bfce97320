"""``zoo bench plan``: zoo plan on every recipe, at 64/256 devices, the planner's scenarios (``zoo.bench.plan``).

The benchmark starts one process per plan (the target's device count, simulated), so it
takes no ``--simulate-devices``.
"""

import dataclasses

from zoo.cli import _types as types


def add_arguments(parser):
    from zoo.bench.plan import SECTIONS, PlanBenchConfig

    d = PlanBenchConfig()
    parser.add_argument("--sections", type=types.comma_separated(SECTIONS, "section"), default=d.sections, help=f"comma-separated tables, of {','.join(SECTIONS)} (default all)")
    parser.add_argument("--recipes", default=d.recipes, help=f"glob of the recipes planned (default {d.recipes})")
    parser.add_argument("--top", type=types.positive_int, default=d.top, help="auto: candidates compiled per scenario")
    parser.add_argument("--output", default=d.output, help="write the markdown report here too")


def run(args):
    from zoo.bench.plan import PlanBenchConfig, run_benchmark

    fields = {f.name for f in dataclasses.fields(PlanBenchConfig)}
    results = run_benchmark(PlanBenchConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 1 if any("error" in row for rows in results.values() for row in rows) else 0
