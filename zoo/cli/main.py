"""``zoo train``, ``zoo verify``, ``zoo generate``, ``zoo bench``, ``zoo comms`` and ``zoo data``.

Each subcommand parses its flags into a config dataclass and calls a function in
``zoo.training`` or ``zoo.bench``; nothing here that a test cannot reach in-process.
Numbers are range-checked as they are parsed (``zoo.cli._types``); failures follow the
error contract of ``zoo.cli._errors`` (exit 2 usage, 1 runtime, one line on stderr).
"""

import argparse
import dataclasses
import os
import sys

import zoo
from zoo.cli import _types, checkpoint_flags
from zoo.cli._errors import ArgumentParser, debug_requested, parse, run_guarded
from zoo.cli.devices import prepare_devices

MODELS = ("cnn",)


def build_parser():
    parser = ArgumentParser(prog="zoo", description="keras-zoo: Keras models that scale by changing the distribution layout.")
    parser.add_argument("--version", action="version", version=f"keras-zoo {zoo.__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too (also ZOO_DEBUG=1)")
    common = ArgumentParser(add_help=False)
    common.add_argument("model", choices=MODELS, help="which zoo model")
    _add_simulate_flag(common)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_trains(commands.add_parser("train", help="train a model with model.fit under a distribution"))
    _add_verify(commands.add_parser("verify", parents=[common], help="compare training under a distribution with one device"))
    _add_generate(commands.add_parser("generate", help="continue a prompt with a GPT saved by zoo train gpt"))
    _add_benches(commands.add_parser("bench", help="benchmarks; results go to docs/performance.md"))
    _add_comms(commands.add_parser("comms", help="collectives and memory of a compiled step"))
    _add_data(commands.add_parser("data", help="list, show and prepare datasets"))
    _add_recipe(commands.add_parser("recipe", help="check or run a recipe (recipes/<target>/<job>.toml)"))
    _add_finetune(commands.add_parser("finetune", help="fine-tune a preset: frozen backbone, LoRA or full"))
    _add_plan(commands.add_parser("plan", help="will a training step fit a target, how fast: compiled, never run (--auto: pick the layout)"))
    return parser


def _add_plan(parser):
    from zoo.cli import plan

    plan.add_arguments(parser)
    _add_simulate_flag(parser)


def _add_finetune(parser):
    from zoo.cli import finetune

    finetune.add_arguments(parser)
    _add_simulate_flag(parser)


def _add_recipe(parser):
    from zoo.cli import recipe

    recipe.add_arguments(parser)


def _add_simulate_flag(parser):
    try:
        parser.add_argument("--simulate-devices", type=_types.positive_int, default=None, metavar="N", help="split the CPU into N devices (default on a CPU-only host: 8)")
    except argparse.ArgumentError:  # already there (from a parent parser): argparse adds nothing then
        pass


def _add_trains(parser):
    from zoo.cli import train_transformers

    models = parser.add_subparsers(dest="model", required=True)
    cnn = models.add_parser("cnn", help="the small CNN on images (shapes by default)")
    _add_train(cnn)
    gpt = models.add_parser("gpt", help="a GPT decoder LM on the embedded Python-docs corpus")
    train_transformers.add_gpt_train(gpt)
    encoder = models.add_parser("encoder", help="a Transformer encoder text classifier (python_docs_topics)")
    train_transformers.add_classifier_train(encoder, "encoder")
    vit = models.add_parser("vit", help="a ViT image classifier (shapes by default)")
    train_transformers.add_classifier_train(vit, "vit")
    for model in (cnn, gpt, encoder, vit):
        _add_simulate_flag(model)


def _add_generate(parser):
    from zoo.cli import train_transformers

    train_transformers.add_generate(parser)
    _add_simulate_flag(parser)


def _add_benches(parser):
    from zoo.cli import bench_attention, bench_context, bench_plan, bench_scale, bench_tp, train_transformers

    benches = parser.add_subparsers(dest="bench", required=True)
    cnn = benches.add_parser("cnn", help="images/s of model.fit vs a hand-written jax.jit step (SmallCNN)")
    _add_bench(cnn)
    gpt = benches.add_parser("gpt", help="tokens/s of model.fit vs a hand-written jax.jit step (GPT)")
    train_transformers.add_gpt_bench(gpt)
    attention = benches.add_parser("attention", help="per-device memory and time of sequence-parallel attention")
    bench_attention.add_arguments(attention)
    tp = benches.add_parser("tp", help="bytes moved and memory of tensor-parallel MLPs: explicit kernels vs GSPMD")
    bench_tp.add_arguments(tp)
    context = benches.add_parser("context", help="per-device memory of a GPT training step: data- vs context-parallel")
    bench_context.add_arguments(context)
    for bench in (cnn, gpt, attention, tp, context):
        _add_simulate_flag(bench)
    scale = benches.add_parser("scale", help="gpt_1b at real size, compile-only: recipe steps, attention, fsdp+tp weights, TP bytes")
    bench_scale.add_arguments(scale)
    plan = benches.add_parser("plan", help="zoo plan on every recipe, gpt_1b at 64/256 devices, the planner's three scenarios")
    bench_plan.add_arguments(plan)


def _add_comms(parser):
    from zoo.cli import comms

    comms.add_arguments(parser)
    _add_simulate_flag(parser)


def _add_distribution_flags(parser, choices, default):
    parser.add_argument("--distribution", choices=choices, default=default, help=f"layout strategy (default {default})")
    parser.add_argument("--mesh", default=None, help="mesh spec such as data=2,model=4 (one axis may be -1); default per strategy")


def _add_train(parser):
    from zoo.training.cnn import TrainConfig

    defaults = TrainConfig()
    _add_distribution_flags(parser, ["single", "data", "model"], defaults.distribution)
    parser.add_argument("--dataset", default=defaults.dataset, help="image dataset (zoo data list); default shapes")
    parser.add_argument("--data-dir", default=None, help="TFDS data folder (default $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)")
    parser.add_argument("--epochs", type=_types.positive_int, default=defaults.epochs)
    parser.add_argument("--batch-size", type=_types.positive_int, default=defaults.batch_size, help="global batch size")
    parser.add_argument("--image-size", type=_types.image_size, default=defaults.image_size, help="default: the dataset's own (shapes: 16, 32, 64 or 128)")
    parser.add_argument("--train-examples", type=_types.positive_int, default=defaults.train_examples, help="default: the whole train split")
    parser.add_argument("--learning-rate", type=_types.positive_float, default=defaults.learning_rate)
    parser.add_argument("--seed", type=_types.non_negative_int, default=defaults.seed)
    parser.add_argument("--output", default=defaults.output, help="path of the saved .keras model")
    parser.add_argument("--dropout", type=_types.dropout, default=defaults.dropout, help="before the logits layer, in [0, 1)")
    checkpoint_flags.add_arguments(parser)


def _add_verify(parser):
    from zoo.training.cnn import VerifyConfig

    defaults = VerifyConfig()
    _add_distribution_flags(parser, ["data", "model"], defaults.distribution)
    parser.add_argument("--steps", type=_types.positive_int, default=defaults.steps)
    parser.add_argument("--batch-size", type=_types.positive_int, default=defaults.batch_size)
    parser.add_argument("--image-size", type=_types.generated_image_size, default=defaults.image_size, help="shapes drawn in memory, any size >= 16")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default=defaults.optimizer)
    parser.add_argument("--rtol", type=_types.non_negative_float, default=defaults.rtol)
    parser.add_argument("--atol", type=_types.non_negative_float, default=defaults.atol)
    parser.add_argument("--seed", type=_types.non_negative_int, default=defaults.seed)


def _add_bench(parser):
    from zoo.bench.cnn_fit import BenchConfig

    defaults = BenchConfig()
    parser.add_argument("--image-size", type=_types.generated_image_size, default=defaults.image_size, help="shapes drawn in memory, any size >= 16")
    parser.add_argument("--batch-size", type=_types.positive_int, default=defaults.batch_size)
    parser.add_argument("--steps", type=_types.positive_int, default=defaults.steps, help="timed steps per measurement")
    parser.add_argument("--repeats", type=_types.positive_int, default=defaults.repeats, help="alternating measurements of each pair")
    parser.add_argument("--output", default=defaults.output, help="write the markdown table here too")


def _add_data(parser):
    actions = parser.add_subparsers(dest="action", required=True)
    data_dir = ArgumentParser(add_help=False)
    data_dir.add_argument("--data-dir", default=None, help="TFDS data folder (default $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)")
    actions.add_parser("list", parents=[data_dir], help="every dataset, its splits and whether it is prepared")
    show = actions.add_parser("show", parents=[data_dir], help="a few examples; images also as a PNG grid")
    show.add_argument("name")
    show.add_argument("--split", default="train")
    show.add_argument("--count", type=_types.positive_int, default=16)
    show.add_argument("--output", default=None, help="PNG path for image datasets (default NAME-SPLIT.png)")
    prepare = actions.add_parser("prepare", parents=[data_dir], help="download (public datasets) and prepare as array_record")
    prepare.add_argument("name")


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


def _config_from(args, config_class):
    fields = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in vars(args).items() if k in fields})


def run(args):
    """Run a parsed command; returns the process exit code."""
    if args.command == "data":
        return _run_data(args)
    if args.command == "recipe":
        from zoo.cli import recipe

        return recipe.run(args) or 0
    if args.command == "plan":
        from zoo.cli import plan

        return plan.run(args)
    if args.command == "finetune":
        from zoo.cli import finetune

        return finetune.run(args) or 0
    if args.command == "comms":
        from zoo.cli import comms

        return comms.run(args) or 0
    if args.command == "bench" and args.bench != "cnn":
        from zoo.cli import bench_attention, bench_context, bench_plan, bench_scale, bench_tp, train_transformers

        runs = {"attention": bench_attention.run, "tp": bench_tp.run, "gpt": train_transformers.run_bench, "context": bench_context.run,
                "scale": bench_scale.run, "plan": bench_plan.run}  # fmt: skip
        return runs[args.bench](args) or 0
    if args.command == "generate":
        from zoo.cli import train_transformers

        return train_transformers.run_generate(args)
    if args.command == "train" and args.model != "cnn":
        from zoo.cli import train_transformers

        return train_transformers.run_train(args)
    if args.command == "train":
        from zoo.training.cnn import TrainConfig, train

        train(_config_from(args, TrainConfig))
        return 0
    if args.command == "verify":
        from zoo.training.cnn import VerifyConfig, verify

        return 0 if verify(_config_from(args, VerifyConfig)).passed else 1
    from zoo.bench.cnn_fit import BenchConfig, run_benchmark

    run_benchmark(_config_from(args, BenchConfig))
    return 0


def main(argv=None):
    """``zoo ARGS``: returns the exit status (docs/cli.md: 0 done, 1 runtime failure,
    2 usage error, 130/143 interrupted; every error one line on stderr)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, status = parse(build_parser(), argv)
    if args is None:
        return status
    return run_guarded(lambda: _prepare_and_run(args), ["zoo", *argv], debug=debug_requested(args.debug))


def _prepare_and_run(args):
    _types.check_image_size(args)
    message = prepare_devices(getattr(args, "simulate_devices", None)) if args.command not in ("data", "recipe") else None
    if message:
        print(message, flush=True)
    try:
        return run(args)
    except ValueError as error:
        from zoo.distribution.layouts import LayoutError
        from zoo.distribution.mesh import MeshError

        about_mesh = isinstance(error, (MeshError, LayoutError)) or "mesh" in str(error)
        if about_mesh and getattr(args, "simulate_devices", None) and getattr(args, "mesh", "") is None:
            error.add_note(f"the default mesh for {args.simulate_devices} devices was used: give --mesh SPEC, or --simulate-devices 8")
        raise


if __name__ == "__main__":
    sys.exit(main())
