"""How deep ``zoo plan`` compiles a model: the whole of it, or two reduced depths whose
every figure is extrapolated per block (``plan.plan_in_process``). The two depths are
``unit`` blocks apart: 1, or stages x repeats under layout pipeline, or whole periods of a
per-layer pattern (Gemma 2's 1:1 local/global alternation: 2; Gemma 3's 5:1: 6), so the
step from one to the other adds what the same blocks of the full model add."""

import math

from zoo.config.layouts import pipelined

FULL_DEPTH_UP_TO = 4  # depth="auto": models this deep or shallower are compiled whole


def depths_to_compile(request, full_depth, needs_two, unit=1, whole=False, why="stages x repeats"):
    """The depths to compile: the whole model, or two reduced depths ``unit`` blocks apart
    (consecutive; else multiples of ``unit``: under layout pipeline stages x repeats, for a
    local/global pattern its period, ``why`` says which). ``whole``: depth auto compiles the
    whole model however deep (remat: see ``plan_in_process``)."""
    if full_depth is None:
        return (None,)
    shallow = full_depth <= FULL_DEPTH_UP_TO * unit
    if request.depth == "full" or (request.depth == "auto" and (whole or shallow) and not needs_two):
        return (full_depth,)
    top = 2 * unit if request.depth in ("auto", "full") else int(request.depth)
    if not 2 * unit <= top <= full_depth or top % unit:
        multiple = f" a multiple of {unit} ({why})" if unit > 1 else ""
        raise ValueError(
            f"depth {request.depth!r}: compile at {2 * unit}..{full_depth} blocks{multiple} (or auto, full)"
        )
    return (top - unit, top)


def layer_period(job, settings):
    """P: the period of the GPT's per-layer pattern (``gpt_configs.layer_period``: Gemma 2's
    local/global alternation 2, Gemma 3's 5:1 pattern 6; 1 for uniform blocks or another
    job); None for a pattern with no period."""
    if job.name != "pretrain_gpt":
        return 1
    from zoo.models.gpt import gpt_configs

    return gpt_configs.layer_period(gpt_configs.config_by_name(settings.config_name))


def pattern_words(settings, period):
    """The pattern of ``period`` blocks in words: "the 5:1 local/global pattern" (Gemma 3)."""
    from zoo.models.gpt.gpt_configs import config_by_name

    windowed = config_by_name(settings.config_name).get("sliding_window_layers")
    if windowed is not None and len([i for i in windowed if i < period]) == period - 1:
        return f"the {period - 1}:1 local/global pattern"
    return "the per-layer pattern"


def period_note(settings, period, depths, full_depth):
    """The plan's line on extrapolating from ``depths``, whole periods of the pattern."""
    periods, left = divmod(full_depth, period)
    counted = f"; the {full_depth} blocks ({periods} periods and {left}) count as {full_depth / period:.2f} periods"
    return (
        f"{depths[0]} and {depths[1]} blocks are whole periods of {pattern_words(settings, period)} ({period} "
        f"blocks): each extrapolated block adds 1/{period} of a period{counted if left else ''}"
    )


def pipeline_unit(request, settings):
    """Layout pipeline: stages x repeats, the step its depth grows by (1 for other layouts)."""
    if not pipelined(getattr(settings, "layout", None)):
        return 1
    from zoo.distribution.axes import STAGE
    from zoo.training.recipes import resolve_axes

    return dict(resolve_axes(settings.mesh, settings.layout, request.devices)).get(STAGE, 1) * settings.repeats


def depth_unit(request, job, settings):
    """``(stages, period, unit, why)``: stages x repeats (1 off layout pipeline), the
    per-layer pattern's period (None: it has none), the step ``unit`` both need (their
    least common multiple) and ``why`` in words for an error naming it."""
    stages, period = pipeline_unit(request, settings), layer_period(job, settings)
    why = " and ".join(
        ([f"stages x repeats {stages}"] if stages > 1 else [])
        + ([f"the period of {pattern_words(settings, period)}, {period}"] if (period or 1) > 1 else [])
    )
    return stages, period, math.lcm(stages, period or 1), why


def depth_notes(request, settings, depths, full_depth, *, period, unit, whole):
    """What the plan says of the depths it compiled (``plan_in_process``): extrapolated from
    two, or compiled whole and why."""
    remat = getattr(settings, "remat", "none")
    if len(depths) == 2:
        notes = [f"compiled at {depths[0]} and {depths[1]} blocks and extrapolated per block to {full_depth}"]
        if (period or 1) > 1:
            notes.append(period_note(settings, period, depths, full_depth))
        if whole:
            notes.append(
                f"with remat={remat!r} extrapolating per block under-counts the temporaries (16-34% measured): "
                "--depth auto or full compiles the whole model"
            )
        return notes
    if full_depth is None or request.depth != "auto":  # a job that compiles only whole (a fine-tune's preset)
        return []
    if period is None and full_depth > FULL_DEPTH_UP_TO:
        return [f"compiled whole: the per-layer pattern of {settings.config_name} repeats no period"]
    if whole and full_depth > FULL_DEPTH_UP_TO * unit:
        return [
            f"compiled whole under remat={remat!r}: extrapolating per block under-counts its temporaries "
            "(16-34% measured; --depth N for a quick estimate)"
        ]
    return []
