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

from zoo.config import schema, types
from zoo.config.settings import GPTTrainSettings

DEPTH_HELP = (
    "auto (deep models: compile 1 and 2 blocks, extrapolate per block; U and 2U blocks where U is the pipeline's "
    "stages x repeats or the period of a local/global pattern: Gemma 2: 2, Gemma 3: 6), full (the whole model), "
    "or N (N-U and N blocks)"
)


# The GPT settings zoo plan takes, as zoo train gpt takes them (same flags, defaults and
# checks: GPTTrainSettings), so that zoo plan FLAGS sizes exactly zoo train gpt FLAGS.
PLANNED_SETTINGS = (
    "config_name",
    "num_layers",
    "capacity_factor",
    "expert_exchange",
    "scan_layers",
    "layout",
    "mesh",
    "context_attention",
    "balance",
    "micro_batches",
    "schedule",
    "repeats",
    "sequence_length",
    "loss_chunk_size",
    "batch_size",
    "precision",
    "remat",
    "gradient_accumulation_steps",
    "moment_dtype",
    "second_moment",
    "state_memory",
)


def _gpt_fields():
    return [field for field in schema.settings_fields(GPTTrainSettings) if field.name in PLANNED_SETTINGS]


def _add_gpt_flags(parser):
    """The GPT flags, generated from ``GPTTrainSettings``; parsed as None when left out (their
    help states the default) so that a recipe can refuse them (the recipe says them)."""
    skip = [field.name for field in schema.settings_fields(GPTTrainSettings) if field.name not in PLANNED_SETTINGS]
    schema.add_flags(parser, GPTTrainSettings, skip=skip)
    parser.set_defaults(**dict.fromkeys(PLANNED_SETTINGS))


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
    _add_gpt_flags(parser)
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
    """``{name: value}`` of the GPT flags, ``GPTTrainSettings``'s defaults filled in."""
    return {
        field.name: field.default if getattr(args, field.name) is None else getattr(args, field.name)
        for field in _gpt_fields()
    }


def _given_gpt_flags(args):
    return [schema.flag_name(field) for field in _gpt_fields() if getattr(args, field.name) is not None]


def request_from(args):
    """``PlanRequest`` of the parsed flags (a recipe's, or the GPT flags')."""
    from zoo.planning.plan import PlanRequest

    depth = int(args.depth) if str(args.depth).isdigit() else args.depth
    if args.recipe:
        _check_not_a_config_name(args.recipe)
        from zoo.planning.recipes import request_from_recipe
        from zoo.training.recipes import load_recipe, parse_override

        given = _given_gpt_flags(args)
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
    settings = _gpt_settings(args)
    if settings["layout"] == "auto":
        raise ValueError("--layout auto is zoo train gpt's planning: zoo plan --auto searches the layouts")
    return PlanRequest(
        "pretrain_gpt",
        settings,
        devices=args.devices or 8,
        device=args.device or "h100",
        device_memory_gib=args.device_memory_gib,
        depth=depth,
        label=settings["config_name"],
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
