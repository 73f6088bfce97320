"""``zoo``: the command line. Every subcommand's parser is built here and dispatches
through ``set_defaults(func=...)``; nothing here a test cannot reach in-process.

The job flags are generated from the job settings dataclasses (``zoo.config.settings``:
the field ``batch_size`` is ``--batch-size`` and the recipe key ``[train] batch_size``).
Building the parser imports only ``zoo.config`` and argparse: ``zoo --help``, ``zoo X
--help`` and a mistyped flag answer without importing JAX or Keras; a command's ``func``
imports what it runs. Numbers are range-checked as they are parsed; failures follow the
error contract of ``zoo.cli._errors`` (exit 2 usage, 1 runtime, one line on stderr).
"""

import os
import sys

import zoo
from zoo.cli import bench, plot
from zoo.cli._errors import ArgumentParser, debug_requested, parse, run_guarded
from zoo.cli.devices import add_simulate_flag
from zoo.config import schema
from zoo.config import settings as job_settings  # the jobs' *Settings classes
from zoo.config import types as _types


def build_parser():
    parser = ArgumentParser(
        prog="zoo", description="keras-zoo: Keras models that scale by changing the distribution layout."
    )
    parser.add_argument("--version", action="version", version=f"keras-zoo {zoo.__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too (also ZOO_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_trains(commands.add_parser("train", help="train a model with model.fit under a distribution"))
    _add_job(
        commands.add_parser("verify", help="compare training under a distribution with one device"),
        job_settings.VerifySettings,
        _run_verify,
        model_choices=("cnn",),
    )
    _add_job(
        commands.add_parser("generate", help="continue a prompt with a GPT saved by zoo train gpt"),
        job_settings.GenerateSettings,
        _run_generate,
    )
    _add_job(
        commands.add_parser("finetune", help="fine-tune a preset: frozen backbone, LoRA or full"),
        job_settings.FinetuneSettings,
        _run_finetune,
    )
    _add_job(
        commands.add_parser("export", help="write a GPT causal LM as a Hugging Face folder (LoRA merged)"),
        job_settings.ExportSettings,
        _run_export,
    )
    bench.add_arguments(
        commands.add_parser("bench", help="benchmarks; results go to docs/performance.md")
    )  # each with --simulate-devices
    _add_comms(commands.add_parser("comms", help="collectives and memory of a compiled step"))
    _add_plan(
        commands.add_parser(
            "plan", help="will a training step fit a target, how fast: compiled, never run (--auto: pick the layout)"
        )
    )
    _add_data(commands.add_parser("data", help="list, show and prepare datasets"))
    _add_recipe(commands.add_parser("recipe", help="check or run a recipe (recipes/<target>/<job>.toml)"))
    plot_parser = commands.add_parser("plot", help="draw a run's metrics.csv (loss, accuracy, throughput) to a PNG")
    plot.add_arguments(plot_parser)
    plot_parser.set_defaults(func=plot.run, simulate_devices=None, uses_devices=False)
    return parser


def _add_job(parser, settings_class, func, *, model_choices=None, defaults=None):
    """A job's flags from its settings; ``func(args)`` runs it."""
    if model_choices:
        parser.add_argument("model", choices=model_choices, help="which zoo model")
    schema.add_flags(parser, settings_class, defaults=defaults)
    add_simulate_flag(parser)
    parser.set_defaults(func=func, settings_class=settings_class)


def _add_trains(parser):
    models = parser.add_subparsers(dest="model", required=True)
    helps = {
        "cnn": "the small CNN on images (shapes by default)",
        "gpt": "a GPT decoder LM on the embedded Python-docs corpus",
        "encoder": "a Transformer encoder text classifier (python_docs_topics)",
        "vit": "a ViT image classifier (shapes by default)",
    }
    for model, settings_class in job_settings.TRAIN_CONFIGS.items():
        _add_job(models.add_parser(model, help=helps[model]), settings_class, _run_train)


def _add_comms(parser):
    from zoo.cli import comms

    comms.add_arguments(parser)
    parser.set_defaults(func=comms.run)


def _add_plan(parser):
    from zoo.cli import plan

    plan.add_arguments(parser)
    add_simulate_flag(parser)
    parser.set_defaults(func=plan.run)


def _add_recipe(parser):
    from zoo.cli import recipe

    recipe.add_arguments(parser)
    parser.set_defaults(func=recipe.run, uses_devices=False)


def _add_data(parser):
    actions = parser.add_subparsers(dest="action", required=True)
    data_dir = ArgumentParser(add_help=False)
    data_dir.add_argument("--data-dir", default=None, metavar="DIR", help=job_settings.DATA_DIR_HELP)
    actions.add_parser("list", parents=[data_dir], help="every dataset, its splits and whether it is prepared")
    show = actions.add_parser("show", parents=[data_dir], help="a few examples; images also as a PNG grid")
    show.add_argument("name", help="a dataset name (zoo data list)")
    show.add_argument("--split", default="train", help="the split shown (default train)")
    show.add_argument("--count", type=_types.positive_int, default=16, metavar="N", help="examples shown (default 16)")
    show.add_argument("--output", default=None, help="PNG path for image datasets (default NAME-SPLIT.png)")
    prepare = actions.add_parser(
        "prepare", parents=[data_dir], help="download (public datasets) and prepare as array_record"
    )
    prepare.add_argument("name", help="a dataset name (zoo data list)")
    parser.set_defaults(func=_run_data, uses_devices=False)


# --- what each command runs (imports happen here, not while parsing) ------------------


def _run_train(args):
    settings = schema.from_args(args.settings_class, args)
    if args.model == "gpt":
        from zoo.training import gpt

        if settings.layout == "auto":
            from zoo.planning.search import choose_layout

            settings = choose_layout(settings)
        gpt.train(settings)
    elif args.model == "cnn":
        from zoo.training import cnn

        cnn.train(settings)
    else:
        from zoo.training import classifiers

        classifiers.train(settings)
    return 0


def _run_verify(args):
    from zoo.training.cnn import verify

    return 0 if verify(schema.from_args(job_settings.VerifySettings, args)).passed else 1


def _run_generate(args):
    from zoo.training.gpt import generate

    generate(schema.from_args(job_settings.GenerateSettings, args))
    return 0


def _run_export(args):
    from zoo.training.export import export

    export(schema.from_args(job_settings.ExportSettings, args))
    return 0


def _run_finetune(args):
    from zoo.training.finetune import finetune

    finetune(schema.from_args(job_settings.FinetuneSettings, args))
    return 0


def _run_data(args):
    from zoo.data import catalog, inspect, tfds_source
    from zoo.data.builders.shapes_builder import IMAGE_SIZES
    from zoo.training.paths import check_data_dir

    data_dir = check_data_dir(args.data_dir)  # not a file, from --data-dir or the environment
    if args.action == "list":
        print(f"data dir: {data_dir}")
        lines = inspect.format_rows(inspect.dataset_rows(args.data_dir))
    elif args.action == "show":
        _check_png_output(args.output)
        lines = inspect.show(args.name, args.split, args.count, args.output, args.data_dir)
    else:
        spec = catalog.get_spec(args.name)
        builders = [f"zoo_shapes/{size}" for size in IMAGE_SIZES] if spec.name == "shapes" else [spec.builder]
        for builder in builders:
            tfds_source.prepare(builder, args.data_dir, download=True)
        lines = [f"prepared {spec.name} in {data_dir}"]
    print("\n".join(lines))
    return 0


def _check_png_output(output):
    """``zoo data show --output``: a file (not a folder) whose folder can be written."""
    from zoo.training.paths import PathError, check_writable_folder

    if output is None:
        return
    if os.path.isdir(output):
        raise PathError("--output", output, "is a folder; give a file name ending in .png")
    check_writable_folder(os.path.dirname(os.path.abspath(output)), "--output", named=output)


def check_image_size(args):
    """``--image-size`` against the dataset's prepared sizes (shapes: 16, 32, 64, 128), after
    parsing (the dataset is another flag); other datasets take their native size or a
    multiple of it, checked when they are loaded. Raises ``ValueError`` naming the flag."""
    size = getattr(args, "image_size", None)
    if size is None or not hasattr(args, "dataset"):
        return
    from zoo.data.load import prepared_image_sizes

    sizes = prepared_image_sizes(args.dataset or "shapes")
    if sizes and size not in sizes:
        raise ValueError(
            f"argument --image-size: {args.dataset or 'shapes'} is prepared at image sizes {', '.join(map(str, sizes))}, got {size}"
        )


def run(args):
    """Run a parsed command; returns the process exit code."""
    return args.func(args) or 0


def main(argv=None):
    """``zoo ARGS``: returns the exit status (docs/cli.md: 0 done, 1 runtime failure,
    2 usage error, 130/143 interrupted; every error one line on stderr)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, status = parse(build_parser(), argv)
    if args is None:
        return status
    return run_guarded(lambda: _prepare_and_run(args), ["zoo", *argv], debug=debug_requested(args.debug))


def _prepare_and_run(args):
    check_image_size(args)
    if getattr(args, "uses_devices", True):
        from zoo.cli.devices import prepare_devices

        message = prepare_devices(getattr(args, "simulate_devices", None))
        if message:
            print(message, flush=True)
    zoo.load_all()  # the zoo command defers this until a command runs (zoo/__init__.py)
    try:
        return run(args)
    except ValueError as error:
        from zoo.distribution.layouts import LayoutError
        from zoo.distribution.mesh import MeshError

        about_mesh = isinstance(error, (MeshError, LayoutError)) or "mesh" in str(error)
        if about_mesh and getattr(args, "simulate_devices", None) and getattr(args, "mesh", "") is None:
            error.add_note(
                f"the default mesh for {args.simulate_devices} devices was used: give --mesh SPEC, or --simulate-devices 8"
            )
        raise


if __name__ == "__main__":
    sys.exit(main())
