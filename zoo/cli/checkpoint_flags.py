"""``--checkpoint-dir``, ``--checkpoint-every``, ``--keep`` and ``--resume`` for ``zoo train``.

Their destinations are the ``TrainConfig`` field names (``checkpoint_dir``,
``checkpoint_every``, ``keep``, ``resume``), so the parsed namespace maps onto the config
as every other ``zoo train`` flag does. See docs/checkpoints.md.
"""

from zoo.cli._types import positive_int


def add_arguments(parser):
    """Add the checkpoint flags to an ``argparse`` parser (defaults from ``TrainConfig``)."""
    from zoo.training.cnn import TrainConfig

    defaults = TrainConfig()
    group = parser.add_argument_group("checkpoints", "Orbax checkpoints during fit that survive a kill (docs/checkpoints.md)")
    group.add_argument("--checkpoint-dir", default=defaults.checkpoint_dir, metavar="DIR", help="save checkpoints here (default: none)")
    group.add_argument(
        "--checkpoint-every", type=positive_int, default=defaults.checkpoint_every, metavar="N",
        help=f"optimizer steps between checkpoints, plus one at the end (default {defaults.checkpoint_every})",
    )
    group.add_argument("--keep", type=positive_int, default=defaults.keep, metavar="N", help=f"newest complete checkpoints kept (default {defaults.keep})")
    group.add_argument(
        "--resume", action="store_true", default=defaults.resume,
        help="continue from the newest usable checkpoint in --checkpoint-dir (skipping damaged ones); start afresh if it has none",
    )

