"""``zoo plan``: size a training step for a target by compiling it (docs/planning.md).

    zoo plan recipes/gpu-8/pretrain_gpt.toml                      # a recipe, on its target
    zoo plan --config-name gpt_1b --devices 256 --device h100 --layout fsdp --batch-size 256
    zoo plan --config-name gpt_350m --layout pipeline --mesh data=2,stage=4 --micro-batches 8
    zoo plan --auto --config-name gpt_1b --devices 8 --device h100 --batch-size 256 --sequence-length 4096
    zoo plan --config-name mixtral_8x7b --devices 64 --layout fsdp+expert --mesh data=8,expert=8 --batch-size 64 --remat

Prints the plan's table; exits 1 with one line on stderr when the step does not fit,
2 on bad input. The logic is in ``zoo.planning``; this module only parses flags.
"""

import os
import sys

from zoo.config import types

DEPTH_HELP = (
    "auto (deep models: compile 1 and 2 blocks, extrapolate per block), full (the whole model), or N (N-1 and N blocks)"
)


def _gpt_flags():
    """The GPT flags: ``(flag, argparse keywords, default)``. Left out, they take the
    default; with a recipe they are refused (the recipe says them; --set changes one)."""
    from zoo.config.choices import (
        CONTEXT_ATTENTIONS,
        EXPERT_EXCHANGES,
        PRECISIONS,
        REMATS,
        SCHEDULES,
        TRANSFORMER_JOB_LAYOUTS,
    )

    return (
        ("--config-name", dict(help="GPT size (zoo.models.GPT_CONFIGS; default gpt_1b)"), "gpt_1b"),
        ("--num-layers", dict(type=types.positive_int, help="override the config's depth L (default: the config's)"), None),
        ("--layout", dict(choices=TRANSFORMER_JOB_LAYOUTS, help="how weights and inputs are split (default data)"), "data"),
        ("--mesh", dict(help="mesh spec such as data=2,model=4 (default: the layout's)"), None),
        ("--context-attention", dict(choices=CONTEXT_ATTENTIONS, help="layout context: the attention kernel (default ring)"), "ring"),
        ("--micro-batches", dict(type=types.positive_int, help="layout pipeline: M micro-batches (default: as many as stages)"), None),
        ("--schedule", dict(choices=SCHEDULES, help="layout pipeline: gpipe or circular (default gpipe)"), "gpipe"),
        ("--repeats", dict(type=types.positive_int, help="layout pipeline: R, rounds of the stages (gpipe 1, circular >= 2; default 1)"), 1),
        ("--capacity-factor", dict(type=types.positive_float, help="MoE configs: expert capacity factor (default: dropless)"), None),
        ("--expert-exchange", dict(choices=EXPERT_EXCHANGES, help="MoE configs under an expert layout: all_to_all or ragged (default all_to_all)"), None),
        ("--batch-size", dict(type=types.positive_int, help="global batch per step (--auto: per optimizer update; default 32)"), 32),
        ("--sequence-length", dict(type=types.sequence_length, help="tokens per example (default: the config's max_sequence_length)"), None),
        ("--precision", dict(choices=PRECISIONS, help="default mixed_bfloat16"), "mixed_bfloat16"),
        ("--remat", dict(nargs="?", const="full", choices=REMATS, help="none | full | dots_saveable (alone: full; default none)"), "none"),
        ("--gradient-accumulation-steps", dict(type=types.positive_int, help="steps per optimizer update (default 1)"), 1),
    )  # fmt: skip


def add_arguments(parser):
    parser.add_argument(
        "recipe", nargs="?", metavar="RECIPE", help="a recipe .toml file to plan on its [target] (else the GPT flags)"
    )
    parser.add_argument(
        "--auto",
        action="store_true",
        help="search layouts x meshes x remat x micro-batch and rank the best few, compiled",
    )
    parser.add_argument(
        "--devices",
        type=types.device_count,
        default=None,
        metavar="N",
        help="target device count (default: the recipe's, else 8)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="device kind: h100 h200 a100 b200 tpu-v4 tpu-v5e tpu-v5p tpu-v6e cpu (default: the recipe's, else h100)",
    )
    parser.add_argument(
        "--device-memory-gib",
        type=types.positive_float,
        default=None,
        metavar="GIB",
        help="memory per device (default: the device kind's)",
    )
    for flag, keywords, _ in _gpt_flags():
        parser.add_argument(flag, default=None, **keywords)
    parser.add_argument("--depth", type=types.depth, default="auto", help=DEPTH_HELP)
    parser.add_argument(
        "--top", type=types.positive_int, default=3, help="--auto: how many candidates to compile (default 3)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        help="with a recipe: override a key",
    )


def _gpt_settings(args):
    """``{dest: value}`` of the GPT flags, defaults filled in."""
    settings = {}
    for flag, keywords, default in _gpt_flags():
        dest = keywords.get("dest", flag[2:].replace("-", "_"))
        value = getattr(args, dest)
        settings[dest] = default if value is None else value
    return settings


def request_from(args):
    """``PlanRequest`` of the parsed flags (a recipe's, or the GPT flags')."""
    from zoo.planning.plan import PlanRequest

    depth = int(args.depth) if str(args.depth).isdigit() else args.depth
    if args.recipe:
        _check_not_a_config_name(args.recipe)
        from zoo.planning.recipes import request_from_recipe
        from zoo.training.recipe import load_recipe, parse_override

        given = [
            flag
            for flag, keywords, _ in _gpt_flags()
            if getattr(args, keywords.get("dest", flag[2:].replace("-", "_"))) is not None
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} describe a GPT without a recipe; with {args.recipe} use --set section.key=value"
            )
        recipe = load_recipe(args.recipe, dict(parse_override(text) for text in args.overrides))
        return request_from_recipe(
            recipe, devices=args.devices, device=args.device, device_memory_gib=args.device_memory_gib, depth=depth
        )
    if args.overrides:
        raise ValueError("--set changes a recipe's key; without a recipe, use the GPT flags")
    from zoo.models.gpt.gpt_configs import config_by_name

    config = _gpt_settings(args)
    config["sequence_length"] = (
        config["sequence_length"] or config_by_name(config["config_name"])["max_sequence_length"]
    )
    return PlanRequest(
        "pretrain_gpt",
        config,
        devices=args.devices or 8,
        device=args.device or "h100",
        device_memory_gib=args.device_memory_gib,
        depth=depth,
        label=config["config_name"],
    )


def _check_not_a_config_name(recipe):
    """``zoo plan gpt_1b``: a GPT config's name where the recipe file goes (and no such file)."""
    from zoo.models.gpt.gpt_configs import GPT_CONFIGS

    if recipe in GPT_CONFIGS and not os.path.exists(recipe):
        raise ValueError(f"{recipe} is no recipe file; did you mean --config-name {recipe}?")


def run(args):
    """Run a parsed ``zoo plan``; returns the exit code."""
    request = request_from(args)
    if args.auto:
        from zoo.planning.search import format_ranking, search

        ranking = search(request, top=args.top, report=lambda line: print(line, flush=True))
        print("\n".join(format_ranking(ranking)))
        best = ranking.best
        if best is None or not best.fits:
            print(f"zoo: no layout fits: {ranking.why_none()}", file=sys.stderr)
            return 1
        return 0
    from zoo.planning import format_plan, make_plan, verdict

    plan = make_plan(request)
    print("\n".join(format_plan(plan)[:-1]))
    line = verdict(plan)
    if not plan.fits:
        print(f"zoo: {line}", file=sys.stderr)
        return 1
    print(line)
    return 0
