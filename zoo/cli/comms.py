"""``zoo comms``: every collective a compiled step runs, with its bytes, and the step's memory.

    zoo comms mlp --mesh data=2,model=4 --megatron-sp
    zoo comms mlp --implementation gspmd --gated --step backward
    zoo comms cnn --layout model

Wire into ``zoo.cli.main`` with ``add_arguments(subparser)`` and ``run(args)``; this
module adds its own ``model`` positional and ``--simulate-devices`` (``main`` reads
``args.simulate_devices`` before JAX starts). What it builds, compiles and reports is
``zoo.planning.comms`` (the flags here, the work there).
"""

import dataclasses

from zoo.cli.devices import add_simulate_flag
from zoo.config import types
from zoo.config.choices import CNN_LAYOUTS
from zoo.config.comms_settings import COMMS_MODELS, COMMS_STEPS, CommsSettings


def add_arguments(parser):
    """The ``zoo comms`` flags, on an ``argparse`` (sub)parser."""
    defaults = CommsSettings()
    parser.add_argument("model", choices=COMMS_MODELS, help="mlp: tensor-parallel MLP block; cnn: SmallCNN")
    add_simulate_flag(parser)
    parser.add_argument(
        "--layout",
        choices=CNN_LAYOUTS,
        default=defaults.layout,
        help="cnn: how weights and inputs are split (mlp: always model)",
    )
    parser.add_argument("--mesh", default=None, help="mesh spec such as data=2,model=4; default: the layout's")
    parser.add_argument(
        "--step", choices=COMMS_STEPS, default=defaults.step, help="what to compile (default train: one optimizer step)"
    )
    parser.add_argument(
        "--implementation",
        choices=["explicit", "gspmd"],
        default=defaults.implementation,
        help="mlp: zoo ParallelMLP or Dense layers + layout map",
    )
    parser.add_argument(
        "--megatron-sp",
        action="store_true",
        help="mlp: Megatron sequence parallelism (input/output split over the sequence)",
    )
    parser.add_argument(
        "--collective-matmul", action="store_true", help="mlp: overlap the sequence collectives with the matmuls"
    )
    parser.add_argument("--gated", action="store_true", help="mlp: gated (GLU) MLP")
    parser.add_argument(
        "--batch-size",
        type=types.positive_int,
        default=defaults.batch_size,
        help=f"global batch; divides by the data axis (default {defaults.batch_size})",
    )
    parser.add_argument(
        "--sequence-length",
        type=types.positive_int,
        default=defaults.sequence_length,
        help=f"mlp: tokens per example T (default {defaults.sequence_length})",
    )
    parser.add_argument(
        "--dim", type=types.positive_int, default=defaults.dim, help=f"mlp: model width C (default {defaults.dim})"
    )
    parser.add_argument(
        "--hidden",
        type=types.positive_int,
        default=defaults.hidden,
        help=f"mlp: hidden features F (default {defaults.hidden})",
    )
    parser.add_argument(
        "--image-size", type=types.at_least(8), default=defaults.image_size, help="cnn: random images, any size >= 8"
    )
    parser.add_argument(
        "--fast-compile", action="store_true", help="skip LLVM optimisation (same collectives and memory)"
    )


def run(args):
    """Print the report of the step ``args`` describe; returns the exit code."""
    fields = {f.name for f in dataclasses.fields(CommsSettings)}
    settings = CommsSettings(**{k: v for k, v in vars(args).items() if k in fields})
    from zoo.planning.comms import comms_for  # JAX and the models: only once a step is asked for

    report = comms_for(settings)
    print("\n".join(report.format()))
    return 0
