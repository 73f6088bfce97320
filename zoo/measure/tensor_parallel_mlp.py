"""The tensor-parallel MLP built two ways on one mesh, for ``zoo comms mlp`` and ``zoo bench tp``.

``explicit_model``: ``zoo.layers.ParallelMLP``, ``shard_map``s with the collectives written
out. ``gspmd_model``: plain ``keras.layers.Dense`` layers under ``ModelParallel`` with a
layout map (kernels split as Megatron splits them; sequence-parallel also the
activations), partitioned by XLA. ``minimum_sent_bytes``: Megatron's bound for one
forward + backward. The shapes come from ``zoo.config.bench_settings.TPBenchSettings``
(B = batch_size, T = sequence_length, C = dim, F = hidden).
"""

import jax
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zoo import distribution as zd
from zoo.config.bench_settings import TP_VARIANTS
from zoo.distribution.axes import DATA, MODEL
from zoo.distribution.mesh import require_axes
from zoo.layers.parallel_mlp import ParallelMLP

# name (TP_VARIANTS) -> (label, gated, megatron_sp): the groups of rows of the table, in order.
VARIANTS = {
    "mlp": ("MLP", False, False),
    "gated": ("gated MLP", True, False),
    "sp": ("MLP, sequence-parallel", False, True),
    "gated-sp": ("gated MLP, sequence-parallel", True, True),
}
assert tuple(VARIANTS) == TP_VARIANTS
SEED = 0


def check_settings(settings):
    for name in ("batch_size", "sequence_length", "dim", "hidden", "steps", "repeats"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    unknown = [name for name in settings.variants if name not in VARIANTS]
    if unknown or not settings.variants:
        raise ValueError(f"variants must be some of {list(VARIANTS)}, got {list(settings.variants)}")
    mesh = zd.make_mesh(settings.mesh)
    require_axes(mesh, (DATA, MODEL), "zoo bench tp")
    data, model = zd.mesh_axis_size(mesh, DATA), zd.mesh_axis_size(mesh, MODEL)
    for what, size, axis, count in (
        ("batch size", settings.batch_size, DATA, data),
        ("sequence length", settings.sequence_length, MODEL, model),
        ("hidden", settings.hidden, MODEL, model),
    ):
        if size % count:
            raise ValueError(f"{what} {size} is not divisible by the {axis!r} mesh axis of size {count}")


def minimum_sent_bytes(settings, dtype_bytes=4):
    """Megatron's bound for one MLP forward + backward: bytes each device sends over the model axis."""
    mesh = zd.make_mesh(settings.mesh)
    data, model = zd.mesh_axis_size(mesh, DATA), zd.mesh_axis_size(mesh, MODEL)
    activation = settings.batch_size // data * settings.sequence_length * settings.dim * dtype_bytes  # (B/N_data, T, C)
    return 2 * 2 * (model - 1) / model * activation  # two all-reduces (or 2 AG + 2 RS)


def explicit_model(settings, gated, megatron_sp, collective=False):
    """(distribution, model) with ``ParallelMLP``; the layers place their own weights."""
    mesh = zd.make_mesh(settings.mesh)
    distribution = zd.CheckedModelParallel(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name=DATA)
    mlp = ParallelMLP(
        settings.hidden,
        activation="gelu",
        gated=gated,
        use_bias=False,
        megatron_sp=megatron_sp,
        collective_matmul=collective,
        name="mlp",
    )
    return distribution, zd.build_distributed(lambda: _functional(settings, mlp), distribution)


def gspmd_model(settings, gated, megatron_sp):
    """(distribution, model): plain Dense layers, placed by a layout map, partitioned by GSPMD.

    Layout rules (C = dim, F = hidden):

    ===============  ==========  ================  =========================
    path             shape       layout            when
    ===============  ==========  ================  =========================
    gate/kernel      (C, F)      (-, model)        gated
    up/kernel        (C, F)      (-, model)        always
    down/kernel      (F, C)      (model, -)        always
    gate/output      (B, T, F)   (data, -, model)  gated, sequence-parallel
    up/output        (B, T, F)   (data, -, model)  sequence-parallel
    down/output      (B, T, C)   (data, model, -)  sequence-parallel
    ===============  ==========  ================  =========================
    """
    mesh = zd.make_mesh(settings.mesh)
    layout_map = keras.distribution.LayoutMap(mesh)
    names = ("gate", "up") if gated else ("up",)
    for name in names:
        layout_map[f".*{name}/kernel"] = (None, MODEL)
        if megatron_sp:
            layout_map[f".*{name}/output"] = (DATA, None, MODEL)
    layout_map[".*down/kernel"] = (MODEL, None)
    if megatron_sp:
        layout_map[".*down/output"] = (DATA, MODEL, None)
    distribution = zd.CheckedModelParallel(layout_map=layout_map, batch_dim_name=DATA)

    def build():
        x = keras.Input((settings.sequence_length, settings.dim), name="x")  # (B, T, C)
        dense = lambda units, name, activation=None: keras.layers.Dense(
            units, activation=activation, use_bias=False, name=name
        )
        up = dense(settings.hidden, "up", None if gated else "gelu")(x)  # (B, T, F)
        h = keras.layers.Multiply(name="glu")([dense(settings.hidden, "gate", "gelu")(x), up]) if gated else up
        return keras.Model(x, dense(settings.dim, "down")(h), name="gspmd_mlp")  # (B, T, C)

    model = build_checked(build, distribution)
    return distribution, model


def build_checked(build, distribution):
    """``build_distributed``, minus its check that every rule matched a *variable*:
    output-layout rules match layer outputs, which that check does not see."""
    keras.distribution.set_distribution(distribution)
    return build()


def _functional(settings, layer):
    x = keras.Input((settings.sequence_length, settings.dim), name="x")  # (B, T, C)
    return keras.Model(x, layer(x), name="explicit_mlp")


def example_input(settings, megatron_sp):
    """x (B, T, C) placed as the layer before the MLP would leave it: batch over data,
    and the sequence over model in sequence-parallel mode."""
    distribution = keras.distribution.distribution()
    x = (
        np.random.default_rng(SEED)
        .standard_normal((settings.batch_size, settings.sequence_length, settings.dim))
        .astype("float32")
    )
    spec = P(DATA, MODEL, None) if megatron_sp else P(DATA, None, None)
    return jax.device_put(x, NamedSharding(distribution.device_mesh.backend_mesh, spec))
