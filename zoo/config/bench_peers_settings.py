"""Settings of ``zoo bench peers``: the zoo and MaxText (and keras-hub) side by side
(``zoo.bench.peers``). Pure Python (no JAX, no Keras)."""

import dataclasses

from zoo.config import _bench_fields as fields
from zoo.config import types
from zoo.config.layouts import PEERS, layouts_in
from zoo.config.schema import setting

PEERS_LAYOUTS = layouts_in(PEERS)  # zoo bench peers: layouts both peers build (mesh data=8 / data=2,model=4)
PEERS_SECTIONS = ("memory", "time")  # zoo bench peers: its tables


@dataclasses.dataclass
class PeersBenchSettings:
    """Settings of ``zoo bench peers``: the zoo and MaxText side by side on the same Llama-style model, parameter counts checked: memory, bytes per mesh axis and FLOPs (Llama-3.2-1B, compile-only) and the interleaved step-time ratio (a small model)."""

    maxtext_venv: str = setting(
        ".peers/maxtext-venv",
        "MaxText 0.2.5's own virtual environment; created by recipes/peers/maxtext_venv.sh when missing "
        "(Python 3.12: $PYTHON312, python3.12 on PATH or a pyenv install)",
        section="bench",
        metavar="DIR",
    )
    keras_hub_venv: str | None = setting(
        None,
        "memory: also keras-hub's Llama under fsdp+tp (its own layout map, no remat), from this virtual environment; "
        "created by recipes/peers/keras_hub_venv.sh when missing; default: not compared",
        section="bench",
        metavar="DIR",
    )
    zoo_python: str | None = setting(
        None,
        "the Python that runs the zoo's side (e.g. a JAX 0.12 env, MaxText's JAX); default: this one",
        section="bench",
        metavar="PYTHON",
    )
    sections: tuple = setting(
        PEERS_SECTIONS,
        f"comma-separated tables, of {','.join(PEERS_SECTIONS)}",
        section="bench",
        parse=types.comma_separated(PEERS_SECTIONS, "section"),
        metavar="SECTIONS",
    )
    layouts: tuple = setting(
        ("fsdp", "tp"),
        f"comma-separated layouts, of {','.join(PEERS_LAYOUTS)}",
        section="bench",
        parse=types.comma_separated(PEERS_LAYOUTS, "layout"),
        metavar="LAYOUTS",
    )
    per_device_batches: tuple = setting(
        (1, 4),
        "memory: comma-separated sequences per device b (global batch 8 b)",
        section="bench",
        parse=types.positive_ints,
        metavar="B,B",
    )
    maxtext_unscanned: bool = setting(
        False, "memory: also compile MaxText with scan_layers=false (its blocks unrolled)", section="bench"
    )
    # the zoo's own settings, passed through to its side (default: what a user gets by default)
    loss_chunk_size: int | None = setting(
        None,
        "the zoo's GPT setting loss_chunk_size (the loss t positions at a time); default: whole",
        section="bench",
        parse=types.positive_int,
    )
    scan_layers: bool = setting(
        False, "the zoo's GPT setting scan_layers (its blocks stacked, run in one lax.scan)", section="bench"
    )
    steps: int = fields.count(3, "time: steps per timed run (about 5 s each on 8 simulated CPU devices)")
    repeats: int = fields.count(3, "time: interleaved runs per side (zoo, MaxText, zoo, ...); medians reported")
    profile: str | None = setting(
        None,
        "time: then one step of each side under the JAX profiler, its trace and optimised HLO under "
        "DIR/<layout>/<side>, and a table of where each side's step time goes (XLA:CPU: matmuls by dtype, "
        "collectives, the rest; the slowest instructions); default: no profile",
        section="bench",
        metavar="DIR",
    )
    output: str | None = fields.output()
