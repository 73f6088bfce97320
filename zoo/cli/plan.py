"""``zoo plan``: size a training step for a target by compiling it (docs/planning.md).

    zoo plan recipes/gpu-8/pretrain_gpt.toml                      # a recipe, on its target
    zoo plan --config gpt_1b --devices 256 --device h100 --strategy fsdp --batch-size 256
    zoo plan --auto --config gpt_1b --devices 8 --device h100 --batch-size 256 --sequence-length 4096

Prints the plan's table; exits 1 with one line on stderr when the step does not fit,
2 on bad input. The logic is in ``zoo.planning``; this module only parses flags.
"""

import sys

DEPTH_HELP = "auto (deep models: compile 1 and 2 blocks, extrapolate per block), full (the whole model), or N (N-1 and N blocks)"


def add_arguments(parser):
    from zoo.layers.transformer_block import REMATS
    from zoo.training.gpt import PRECISIONS, GPTTrainConfig

    d = GPTTrainConfig()
    parser.add_argument("recipe", nargs="?", metavar="RECIPE", help="a recipe .toml file to plan on its [target] (else the flags below)")
    parser.add_argument("--auto", action="store_true", help="search layouts x meshes x remat x micro-batch and rank the best few, compiled")
    parser.add_argument("--config", "--model", dest="config_name", default="gpt_1b", help="GPT size (zoo.models.GPT_CONFIGS; default gpt_1b)")
    parser.add_argument("--devices", type=int, default=None, metavar="N", help="target device count (default: the recipe's, else 8)")
    parser.add_argument("--device", default=None, help="device kind: h100 h200 a100 b200 tpu-v4 tpu-v5e tpu-v5p tpu-v6e cpu (default: the recipe's, else h100)")
    parser.add_argument("--device-memory-gib", type=float, default=None, metavar="GIB", help="memory per device (default: the device kind's)")
    parser.add_argument("--strategy", default=d.strategy, help="layout: data fsdp tp tp+sp fsdp+tp context single (default data)")
    parser.add_argument("--mesh", default=None, help="mesh spec such as data=2,model=4 (default per strategy)")
    parser.add_argument("--attention", choices=["gather", "ring", "ulysses"], default=d.attention, help="context strategy: the kernel")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch per step (--auto: per optimizer update)")
    parser.add_argument("--sequence-length", type=int, default=None, help="tokens per example (default: the config's max_sequence_length)")
    parser.add_argument("--precision", choices=PRECISIONS, default="mixed_bfloat16", help="default mixed_bfloat16")
    parser.add_argument("--remat", nargs="?", const="full", choices=REMATS, default=d.remat, help="none | full | dots_saveable (alone: full)")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1, help="steps per optimizer update")
    parser.add_argument("--depth", default="auto", help=DEPTH_HELP)
    parser.add_argument("--top", type=int, default=3, help="--auto: how many candidates to compile (default 3)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="SECTION.KEY=VALUE", help="recipe: override a key")


def requests_from(args):
    """``PlanRequest`` of the parsed flags (a recipe's, or the GPT flags')."""
    from zoo.planning.plan import PlanRequest

    depth = int(args.depth) if str(args.depth).isdigit() else args.depth
    if args.recipe:
        from zoo.planning.recipes import request_from_recipe
        from zoo.training.recipe import load_recipe, parse_override

        recipe = load_recipe(args.recipe, dict(parse_override(text) for text in args.overrides))
        return request_from_recipe(recipe, devices=args.devices, device=args.device, device_memory_gib=args.device_memory_gib, depth=depth)
    from zoo.models.gpt.gpt_configs import config_by_name

    length = args.sequence_length or config_by_name(args.config_name)["max_sequence_length"]
    config = dict(
        config_name=args.config_name, strategy=args.strategy, mesh=args.mesh, attention=args.attention, batch_size=args.batch_size,
        sequence_length=length, precision=args.precision, remat=args.remat, gradient_accumulation_steps=args.gradient_accumulation_steps,
    )  # fmt: skip
    return PlanRequest(
        "pretrain_gpt", config, devices=args.devices or 8, device=args.device or "h100", device_memory_gib=args.device_memory_gib,
        depth=depth, label=args.config_name,
    )  # fmt: skip


def run(args):
    """Run a parsed ``zoo plan``; returns the exit code."""
    request = requests_from(args)
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
