"""``zoo recipe check|run RECIPE``: plan or run a recipe file (``recipes/<target>/<job>.toml``).

``check`` needs no accelerator: it parses the file, builds the mesh and the model
abstractly and prints the plan (parameters, memory per device, tokens per step).
``run`` runs the job on this host; on a multi-host target every host runs the same
command. The logic is in ``zoo.training.recipes``; this module only parses flags.
``check`` prints each plan on stdout and each file's error as one line on stderr.
"""

import sys
import traceback

from zoo.cli._errors import (
    ArgumentParser,
    debug_requested,
    one_line,
    parse,
    run_guarded,
)
from zoo.config import types


def add_arguments(parser):
    """Add ``check`` and ``run`` (and their flags) to the ``zoo recipe`` parser."""
    actions = parser.add_subparsers(dest="action", required=True)
    check = actions.add_parser(
        "check", help="parse, build mesh and model abstractly, print the plan (no devices needed)"
    )
    check.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe .toml file(s)")
    check.add_argument(
        "--devices",
        type=types.device_count,
        default=None,
        metavar="N",
        help="check against N devices instead of the file's [target] hosts x devices_per_host",
    )
    check.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="skip compiling the step (the memory verdict then counts weights, gradients and optimizer state only)",
    )
    check.add_argument(
        "--depth",
        type=types.depth,
        default="auto",
        help="the step's compile depth for the memory verdict (zoo plan --depth)",
    )
    run = actions.add_parser("run", help="run the recipe's job (on every host of a multi-host target)")
    run.add_argument("recipe", metavar="RECIPE", help="recipe .toml file")
    run.add_argument(
        "--coordinator-address",
        default=None,
        metavar="HOST:PORT",
        help="process 0's address, the same on every host (default: [multihost] coordinator_address, "
        "$JAX_COORDINATOR_ADDRESS, or SLURM / Cloud TPU auto-detection)",
    )
    run.add_argument(
        "--process-id",
        type=types.non_negative_int,
        default=None,
        metavar="I",
        help="this host's index 0..hosts-1 (default: $JAX_PROCESS_ID or the cluster's)",
    )
    for action in (check, run):
        action.add_argument(
            "--set",
            action="append",
            default=[],
            dest="overrides",
            metavar="SECTION.KEY=VALUE",
            help="override a key of the file, e.g. --set train.epochs=1 (repeatable; checked like the file)",
        )


def run(args):
    """Run a parsed ``zoo recipe`` command; returns the exit code."""
    from zoo.training.recipes import load_recipe, parse_override, run_recipe

    overrides = dict(parse_override(text) for text in args.overrides)
    if args.action == "check":
        debug = debug_requested(getattr(args, "debug", False))
        return _check(
            args.recipes, overrides, args.devices, compile_depth=args.depth if args.compile else None, debug=debug
        )
    recipe = load_recipe(args.recipe, overrides)
    _prepare_devices(recipe)
    run_recipe(recipe, coordinator_address=args.coordinator_address, process_id=args.process_id)
    return 0


def _check(paths, overrides, devices, compile_depth="auto", debug=False):
    """Print each recipe's plan (stdout) and, unless ``compile_depth`` is None, the memory
    verdict of its compiled step (``zoo plan``); a file's error is one line on stderr
    (after its traceback with ``debug``). Every file is checked; the exit status is 2 if
    any recipe is invalid, else 1 if any step does not fit its target (as ``zoo plan``)."""
    from zoo.training.recipes import (
        RecipeError,
        UnsupportedKeyError,
        check_recipe,
        load_recipe,
    )

    invalid, too_big, printed = 0, 0, False
    for path in paths:
        lines, error, fits = [], None, True
        try:
            recipe = load_recipe(path, overrides)
            lines = check_recipe(recipe, device_count=devices).format()
            if compile_depth is not None:
                verdict, fits = _compiled_verdict(recipe, devices, compile_depth)
                lines, error = (lines + [verdict], None) if fits else (lines, verdict)
        except UnsupportedKeyError as unsupported:
            lines, error = (unsupported.plan.format() if unsupported.plan else []), one_line(unsupported)
            _traceback_if(debug)
        except RecipeError as bad:
            error = one_line(bad)
            _traceback_if(debug)
        if lines:
            print(("\n" if printed else "") + "\n".join(lines), flush=True)
            printed = True
        if error is not None:
            invalid, too_big = invalid + fits, too_big + (not fits)
            print(f"zoo: error: {error}", file=sys.stderr, flush=True)
    return 2 if invalid else 1 if too_big else 0


def _traceback_if(debug):
    if debug:
        traceback.print_exc()


def _compiled_verdict(recipe, devices, depth):
    """``(line, fits)``: the recipe's step compiled for its target (``zoo.planning``)."""
    from zoo.planning import make_plan, verdict
    from zoo.planning.recipes import request_from_recipe

    depth = int(depth) if str(depth).isdigit() else depth
    plan = make_plan(request_from_recipe(recipe, devices=devices, depth=depth))
    how = (
        "whole model"
        if len(plan.compiled_depths) < 2
        else f"{plan.compiled_depths[0]} and {plan.compiled_depths[1]} blocks, extrapolated to {plan.full_depth}"
    )
    return f"memory per device (compiled step, {how}): {verdict(plan)}", plan.fits


def _prepare_devices(recipe):
    """A CPU recipe runs on simulated CPU devices, ``devices_per_host`` of them, even on a
    GPU/TPU machine; must run before anything touches JAX's devices."""
    if recipe.target.platform != "cpu":
        return
    import jax

    from zoo.distribution import simulate_cpu_devices
    from zoo.distribution.devices import backends_started

    if not backends_started():
        jax.config.update("jax_platforms", "cpu")
    simulate_cpu_devices(recipe.target.devices_per_host)


def main(argv=None):
    """``python recipes/run.py check|run RECIPE``: the same as ``zoo recipe``, with the
    same exit statuses and one-line errors (``zoo.cli._errors``)."""
    parser = ArgumentParser(prog="zoo recipe", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too (also ZOO_DEBUG=1)")
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args, status = parse(parser, argv)
    if args is None:
        return status
    return run_guarded(lambda: run(args), ["zoo", "recipe", *argv], debug=debug_requested(args.debug))


if __name__ == "__main__":
    sys.exit(main())
