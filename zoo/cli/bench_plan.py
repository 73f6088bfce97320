"""``zoo bench plan``: zoo plan on every recipe, at 64/256 devices, the planner's scenarios (``zoo.bench.plan``).

The benchmark starts one process per plan (the target's device count, simulated), so it
takes no ``--simulate-devices``.
"""

import dataclasses


def _sections(text):
    from zoo.bench.plan import SECTIONS

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        import argparse

        raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; choose from {','.join(SECTIONS)}")
    return names


def add_arguments(parser):
    from zoo.bench.plan import SECTIONS, PlanBenchConfig

    d = PlanBenchConfig()
    parser.add_argument("--sections", type=_sections, default=d.sections, help=f"comma-separated tables, of {','.join(SECTIONS)} (default all)")
    parser.add_argument("--recipes", default=d.recipes, help=f"glob of the recipes planned (default {d.recipes})")
    parser.add_argument("--top", type=int, default=d.top, help="auto: candidates compiled per scenario")
    parser.add_argument("--output", default=d.output, help="write the markdown report here too")


def run(args):
    from zoo.bench.plan import PlanBenchConfig, run_benchmark

    fields = {f.name for f in dataclasses.fields(PlanBenchConfig)}
    results = run_benchmark(PlanBenchConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 1 if any("error" in row for rows in results.values() for row in rows) else 0
