"""``zoo bench plan``: ``zoo plan`` on every recipe, gpt_1b at 64 and 256 devices, the
planner's three scenarios, and extrapolated vs whole-model compiles.

Every figure comes from a step compiled (never run) for the target's device count on
simulated CPU devices (``zoo.planning.make_plan``: in this process when it has that many,
else a fresh one); the wall time of each plan, a fresh process' start-up included, is
recorded: what a user waits for ``zoo plan`` on this machine.

1. **recipes**: each recipe under ``recipes/`` planned on its ``[target]``.
2. **scale**: gpt_1b (fsdp; fsdp+tp) planned at 64 and 256 devices.
3. **auto**: ``zoo plan --auto`` on three scenarios where plain data parallelism does not
   fit: gpt_1b on 8 x 16 GiB (TPU v5e); gpt_1b at T = 32,768 on 8 x H100; gpt_350m with a
   batch of 1,024 on 8 x H100. The best layout, its peak and its estimated step.
4. **depth**: the gpu-8 gpt_1b recipe compiled whole against the plan's extrapolation
   from 1 and 2 blocks (the plan's peak must be within 5%).
"""

import dataclasses
import glob
import time

from zoo.bench._output import publish
from zoo.config.bench_settings import PLAN_SECTIONS, PlanBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.layouts import FSDP, FSDP_TP
from zoo.planning.plan import PlanRequest, make_plan
from zoo.units import GIB

SECTIONS = PLAN_SECTIONS
SCALE = (
    (FSDP, "data=64", 64, 256),
    (FSDP, "data=256", 256, 1024),
    (FSDP_TP, "data=64,model=4", 256, 1024),
)  # layout, mesh, devices, global batch
SCENARIOS = (
    ("gpt_1b on 8 x 16 GiB", {"config_name": "gpt_1b", "batch_size": 32, "sequence_length": 2048}, "tpu-v5e"),
    ("gpt_1b at T=32k", {"config_name": "gpt_1b", "batch_size": 8, "sequence_length": 32768}, "h100"),
    ("gpt_350m, batch 1024", {"config_name": "gpt_350m", "batch_size": 1024, "sequence_length": 1024}, "h100"),
)
DEPTH_RECIPE = "recipes/gpu-8/pretrain_gpt.toml"


def _gpt(config_name, **settings):
    base = {
        "config_name": config_name,
        "layout": "data",
        "mesh": None,
        "precision": "mixed_bfloat16",
        "remat": "none",
        "gradient_accumulation_steps": 1,
    }
    return {**base, **settings}


def _timed(request):
    """``(plan, seconds)``: ``make_plan`` as ``zoo plan`` runs it (a fresh process unless
    this one has the target's device count), timed."""
    start = time.perf_counter()
    plan = make_plan(request)
    return plan, time.perf_counter() - start


def recipe_rows(settings, report):
    from zoo.planning.recipes import request_from_recipe
    from zoo.training.recipes import load_recipe

    rows = []
    for path in sorted(glob.glob(settings.recipes)):
        report(f"planning {path} ...")
        try:
            plan, seconds = _timed(request_from_recipe(load_recipe(path)))
        except (ValueError, RuntimeError) as error:
            rows.append({"label": path, "error": str(error)})
            continue
        rows.append({"label": path, "plan": plan, "seconds": seconds})
    return rows


def scale_rows(settings, report):
    rows = []
    for layout, mesh, devices, batch in SCALE:
        request = PlanRequest(
            "pretrain_gpt",
            _gpt("gpt_1b", layout=layout, mesh=mesh, batch_size=batch, sequence_length=2048, remat="full"),
            devices=devices,
            device="h100",
            label=f"gpt_1b {layout} {mesh}",
        )
        report(f"planning {request.label} on {devices} simulated devices ...")
        plan, seconds = _timed(request)
        rows.append({"label": request.label, "plan": plan, "seconds": seconds})
    return rows


def auto_rows(settings, report):
    from zoo.planning.search import search

    rows = []
    for name, gpt_fields, device in SCENARIOS:
        request = PlanRequest("pretrain_gpt", _gpt(**gpt_fields), devices=8, device=device, label=name)
        report(f"searching {name} ...")
        start = time.perf_counter()
        ranking = search(request, top=settings.top)
        seconds = time.perf_counter() - start
        data, _ = _timed(
            dataclasses.replace(request, config={**request.config, "mesh": "data=8"})
        )  # plain data parallelism
        rows.append({"label": name, "ranking": ranking, "seconds": seconds, "data": data})
    return rows


def depth_rows(settings, report):
    from zoo.planning.recipes import request_from_recipe
    from zoo.training.recipes import load_recipe

    request = request_from_recipe(load_recipe(DEPTH_RECIPE))
    rows = []
    for depth in ("auto", "full"):
        report(f"planning {DEPTH_RECIPE} at depth {depth} ...")
        plan, seconds = _timed(dataclasses.replace(request, depth=depth))
        rows.append({"label": depth, "plan": plan, "seconds": seconds})
    return rows


def run_benchmark(settings, report=print):
    """Every section asked for; returns ``{section: rows}`` (the report also goes to ``settings.output``)."""
    measure = {"recipes": recipe_rows, "scale": scale_rows, "auto": auto_rows, "depth": depth_rows}
    results = {section: measure[section](settings, report) for section in settings.sections}
    text = "\n".join(format_report(results))
    publish(text, settings, report)
    return results


# --- the report ---------------------------------------------------------------------------


def _plan_cells(plan):
    mfu = f"{100 * plan.mfu:.1f}%" if plan.mfu is not None else "-"
    return f"{plan.peak / GIB:,.2f} / {plan.device_memory / GIB:,.0f} | {'yes' if plan.fits else 'NO'} | {plan.time.step_s * 1e3:,.1f} | {mfu}"


def _table(title, header, rows):
    """A markdown table: ``header`` is the list of column titles (``:`` suffix: right-aligned)."""
    names = [name.rstrip(":") for name in header]
    rules = ["---:" if name.endswith(":") else "---" for name in header]
    return [f"### {title}", "", f"| {' | '.join(names)} |", f"| {' | '.join(rules)} |", *rows, ""]


def _recipes_table(rows):
    lines = []
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['label']} | error: {row['error']} | | | | | | | |")
            continue
        plan = row["plan"]
        layout = f"{plan.request.config.get('layout')} {plan.step.mesh or ''}".strip()
        depth = (
            "whole" if len(plan.compiled_depths) < 2 else f"{plan.compiled_depths[0]}+{plan.compiled_depths[1]} blocks"
        )
        lines.append(
            f"| {row['label']} | {layout} | {plan.request.devices} x {plan.spec.name} | {_plan_cells(plan)} | {depth} | {row['seconds']:.0f} |"
        )
    header = [
        "recipe",
        "layout",
        "devices",
        "peak / memory (GiB):",
        "fits",
        "est. step (ms):",
        "MFU:",
        "compiled",
        "wall (s):",
    ]
    return _table("zoo plan on every recipe", header, lines)


def _scale_table(rows):
    lines = [
        f"| {row['label']} | {row['plan'].request.devices} | {row['plan'].step.batch_size} | {_plan_cells(row['plan'])} | "
        f"{row['plan'].step.compile_s:.0f} | {row['seconds']:.0f} |"
        for row in rows
    ]
    header = [
        "layout",
        "devices:",
        "global batch:",
        "peak / memory (GiB):",
        "fits",
        "est. step (ms):",
        "MFU:",
        "compile (s):",
        "wall (s):",
    ]
    return _table("gpt_1b at 64 and 256 simulated devices (T=2048, bf16, remat full, H100)", header, lines)


def _auto_table(rows):
    lines = []
    for row in rows:
        ranking, data = row["ranking"], row["data"]
        lines.append(
            f"| {row['label']} | {ranking.considered} ({ranking.analytic_fits}) | {ranking.best.candidate.describe()} | "
            f"{_plan_cells(ranking.best.plan)} | {'fits' if data.fits else 'no'}: {data.peak / GIB:,.1f} GiB | {row['seconds']:.0f} |"
        )
    header = [
        "scenario",
        "candidates (fit analytically):",
        "best",
        "peak / memory (GiB):",
        "fits",
        "est. step (ms):",
        "MFU:",
        "data=8 alone (compiled)",
        "wall (s):",
    ]
    return _table("zoo plan --auto: three scenarios where data parallelism does not fit (8 devices)", header, lines)


def _depth_table(rows):
    auto, whole = (row["plan"] for row in rows)
    error = auto.peak / whole.peak - 1
    lines = [
        f"| {'blocks ' + ' and '.join(map(str, row['plan'].compiled_depths)) if row['label'] == 'auto' else 'whole model'} | "
        f"{row['plan'].peak / GIB:,.2f} | {row['plan'].step.flops / 1e12:,.1f} | {row['seconds']:.0f} |"
        for row in rows
    ]
    table = _table(
        f"{DEPTH_RECIPE}: extrapolated vs whole-model compile",
        ["compiled", "peak (GiB):", "FLOPs per device (T):", "wall (s):"],
        lines,
    )
    return table + [
        f"Extrapolated peak vs whole: {100 * error:+.2f}% ({'within' if abs(error) <= 0.05 else 'OUTSIDE'} 5%)."
    ]


def format_report(results):
    """The markdown report: one table per section measured."""
    tables = {"recipes": _recipes_table, "scale": _scale_table, "auto": _auto_table, "depth": _depth_table}
    return [line for section in SECTIONS if section in results for line in tables[section](results[section])]
