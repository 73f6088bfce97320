"""The one bridge from the active Keras distribution to the zoo's parallel layers.

Every parallel layer (``MultiHeadAttention``, ``ColumnParallelDense``, ``PipelinedBlocks``,
``RowParallelDense``, ``ParallelMLP``, ``TransformerBlock``) asks ``resolve_plan`` once
per call (and once when it builds) what the global distribution
(``keras.distribution.distribution()``: Keras does not enter the distribution as a
context during ``fit``, so the global one is in force) splits, and gets one frozen
``ParallelPlan``: the mesh, the batch / sequence / model / weight-shard axes with their
sizes, the context-attention kernel and the balance. Nothing else in ``zoo/layers``
reads the distribution.

Where each field comes from:

==================  =========================================================================
distribution        plan
==================  =========================================================================
none                no mesh; nothing split (``ParallelPlan()``)
DataParallel        batch over its ``batch_dim_name``
ModelParallel       batch over its ``batch_dim_name``; model over the layer's ``model_axis``;
                    weights also over its ``weight_shard_axis`` (``fsdp+tp``); the sequence
                    over the attention layer's ``sequence_axis`` if the mesh has it
ContextParallel     as ModelParallel, and the sequence over ``sequence_dim_name`` (every
                    (B, T, ...) input arrives split on T); its ``context_attention`` for a
                    layer whose kernel is None, and its ``balance``
ExpertParallel      as ModelParallel, with the batch over both ``batch_axes`` (``data`` and
                    ``expert``: ``batch_axis`` is then a tuple of the two where both split)
                    and the experts of MoE layers over ``expert_dim_name``
==================  =========================================================================

An axis the mesh lacks, or has with size 1, is None in the plan (size 1): it splits
nothing, and naming it in a ``shard_map`` spec would only add collectives over one device.

Context attention: the kernel runs only where the plan has a sequence axis
(``plan.context_attention`` is None otherwise). A kernel named by the layer (or recorded
in its saved config) under a distribution whose mesh has no sequence axis, or one of
size 1 (one device, ``DataParallel``, tensor parallelism alone), runs plain attention:
the same numbers, no ``shard_map``. So a model trained with ring attention loads and runs
anywhere; ``zoo.distribution.describe(model)`` says what runs.

``run_sharded`` is the one way the layers run a ``shard_map``: one ``jax.jit`` of it per
(body, mesh, specs, settings), kept, so an eager call reuses its compilation
(a fresh ``shard_map`` per call would recompile every time); inside an outer ``jit`` it
is inlined. ``run_on_mesh`` is the same program for code that holds a mesh and no plan
(the benchmarks that measure a kernel on its own). ``run_manual_over`` is the same program
manual over some mesh axes only, the others left to GSPMD inside it: ``PipelinedBlocks``,
manual over ``stage`` (and the batch axis), its ``model`` axis split by the layout map. No
other module calls ``jax.shard_map`` (``tests/test_architecture.py``).
"""

import dataclasses
import functools

import jax
import keras
from jax.sharding import PartitionSpec as P

from zoo._compat import variable_layout
from zoo.config.choices import BALANCES, CONTEXT_ATTENTIONS
from zoo.distribution.axes import DATA, MODEL, SEQ
from zoo.distribution.context_parallel import ContextParallel
from zoo.distribution.expert_parallel import ExpertParallel
from zoo.distribution.mesh import mesh_axis_size

KERNEL_CHOICES = (None, *CONTEXT_ATTENTIONS)  # a layer's context_attention (None: plain, or the distribution's)


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    """What the current distribution splits, for one layer's settings. Sizes are 1 where
    the axis is None."""

    keras_mesh: object = None  # keras.distribution.DeviceMesh; None without a distribution
    mesh: jax.sharding.Mesh | None = None  # the same mesh, as JAX sees it
    batch_axis: str | tuple | None = None  # the batch (dim 0) is split over this (ExpertParallel: (data, expert))
    batch_size: int = 1
    sequence_axis: str | None = (
        None  # the sequence (dim 1) is split over this (attention; ContextParallel: every input)
    )
    sequence_size: int = 1  # N, also the number of shards a balanced order is cut for
    model_axis: str | None = None  # tensor parallelism splits features / heads over this
    model_size: int = 1
    weight_shard_axis: str | None = None  # weights also split over this (FSDP inside TP), gathered in the body
    weight_shard_size: int = 1
    context_attention: str | None = None  # the kernel that runs: None when the sequence is not split
    balance: str | None = None  # the load-balanced order the inputs are in (None: natural)
    context_parallel: bool = False  # a ContextParallel distribution: (B, T, ...) inputs arrive split on T
    expert_axis: str | None = None  # MoE layers split their experts over this (ExpertParallel)
    expert_size: int = 1

    @property
    def batch_axes(self):
        """The mesh axes the batch is split over, major first (a tuple; empty when whole)."""
        if self.batch_axis is None:
            return ()
        return self.batch_axis if isinstance(self.batch_axis, tuple) else (self.batch_axis,)

    def for_batch(self, batch):
        """This plan for a batch of ``batch`` rows: the batch split over the batch axes, major
        first, whose running product divides it, the others left out (None: no axis divides it,
        every device holds the whole batch). The plan itself when ``batch`` divides the whole
        split or is unknown (None). A decoding batch of a few prompts rarely divides
        ``data`` x ``expert``: 2 prompts on data=2,expert=4 split over ``data`` alone."""
        if batch is None or self.batch_axis is None or batch % self.batch_size == 0:
            return self
        kept, size = [], 1
        for axis in self.batch_axes:
            if batch % (size * mesh_axis_size(self.keras_mesh, axis)) == 0:
                kept.append(axis)
                size *= mesh_axis_size(self.keras_mesh, axis)
        axis = None if not kept else kept[0] if len(kept) == 1 else tuple(kept)
        return dataclasses.replace(self, batch_axis=axis, batch_size=size)

    @property
    def token_axes(self):
        """The mesh axes the tokens are split over: the batch's, and the sequence's under
        context parallelism (a tuple; empty when every device holds them all)."""
        return tuple(axis for axis in (*self.batch_axes, self.sequence_axis) if axis is not None)

    def weights_whole_unless_tokens_split(self):
        """This plan with the weights whole on the FSDP axis (``weight_shard_axis`` None: GSPMD
        gathers them before the ``shard_map``) when the tokens are not split over it: a body
        that gathered them over an axis its tokens do not vary on would return a value
        typed as varying there (``for_batch``'s whole batch: 1 prompt on data=2 under fsdp+tp
        or fsdp+expert)."""
        if self.weight_shard_axis is None or self.weight_shard_axis in self.token_axes:
            return self
        return dataclasses.replace(self, weight_shard_axis=None, weight_shard_size=1)

    @property
    def tensor_parallel(self):
        """Whether the tensor-parallel layers split over a model axis (N > 1)."""
        return self.model_axis is not None

    def layout(self, axes):
        """A ``TensorLayout``; a ``NamedSharding`` when a dimension is split over several
        axes (``(SEQ, MODEL)``), which ``TensorLayout`` cannot name and Keras'
        ``distribute_tensor`` takes as it is on JAX."""
        if any(isinstance(axis, tuple) for axis in axes):
            return jax.sharding.NamedSharding(self.mesh, P(*axes))
        return keras.distribution.TensorLayout(axes, self.keras_mesh)


def check_choices(context_attention, balance):
    """Raises unless ``context_attention`` is None or a kernel, and ``balance`` a balance."""
    if context_attention not in KERNEL_CHOICES:
        raise ValueError(f"context_attention must be one of {KERNEL_CHOICES}, got {context_attention!r}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")


def resolve_plan(*, model_axis=MODEL, sequence_axis=None, batch_axis=None, context_attention=None, balance=None):
    """The ``ParallelPlan`` under the global distribution for one layer's settings.

    ``sequence_axis``, ``context_attention``, ``balance``: the attention layer's (the
    tensor-parallel layers pass None: only a ``ContextParallel`` splits their sequence).
    ``batch_axis``: the axis the layer expects the batch on (None or ``DATA``: the
    distribution's). Under a ``ContextParallel`` a layer's ``sequence_axis`` other than
    ``SEQ``, a ``batch_axis`` other than ``DATA`` or a ``balance`` other than None must
    agree with the distribution, which decides how inputs are split and ordered; a
    layer's ``batch_axis`` must agree with any distribution's ``batch_dim_name``.
    """
    check_choices(context_attention, balance)
    distribution = keras.distribution.distribution()
    if distribution is None:
        return ParallelPlan(context_attention=None, balance=balance)
    keras_mesh = distribution.device_mesh
    batch_axis = _batch_axis(distribution, batch_axis)
    context = isinstance(distribution, ContextParallel)
    if context:
        _check_agrees("sequence_axis", sequence_axis, SEQ, "sequence_dim_name", distribution.sequence_dim_name)
        _check_agrees("balance", balance, None, "balance", distribution.balance)
        sequence_axis, balance = distribution.sequence_dim_name, distribution.balance
        context_attention = context_attention or distribution.context_attention
    split = functools.partial(_split_axis, keras_mesh)
    model, sequence, weight_shard = (
        split(model_axis),
        split(sequence_axis),
        split(getattr(distribution, "weight_shard_axis", None)),
    )
    if model is not None:
        _check_distinct(
            model, batch=split(batch_axis), sequence=sequence if context else None, weight_shard=weight_shard
        )
    size = functools.partial(mesh_axis_size, keras_mesh)
    batch, batch_size = split(batch_axis), size(batch_axis) if split(batch_axis) else 1
    expert = split(distribution.expert_dim_name) if isinstance(distribution, ExpertParallel) else None
    if expert is not None:  # the batch over (data, expert): the axes of size > 1, a tuple when both
        batch = distribution.batch_axes if len(distribution.batch_axes) > 1 else distribution.batch_axes[0]
        batch_size = distribution.batch_split
    return ParallelPlan(
        keras_mesh=keras_mesh,
        mesh=keras_mesh.backend_mesh,
        batch_axis=batch,
        batch_size=batch_size,
        sequence_axis=sequence,
        sequence_size=size(sequence) if sequence else 1,
        model_axis=model,
        model_size=size(model) if model else 1,
        weight_shard_axis=weight_shard,
        weight_shard_size=size(weight_shard) if weight_shard else 1,
        context_attention=context_attention if sequence else None,
        balance=balance,
        context_parallel=context,
        expert_axis=expert,
        expert_size=size(expert) if expert else 1,
    )


def distribution_context_attention():
    """The active ``ContextParallel``'s ``context_attention``, else None: the kernel a
    layer built with ``context_attention=None`` records in its config."""
    distribution = keras.distribution.distribution()
    return distribution.context_attention if isinstance(distribution, ContextParallel) else None


def weight_axes(variable):
    """The mesh axes per dimension of ``variable`` under the global distribution (a tuple,
    None entries for whole dimensions): the layout it was created or initialised with,
    else the distribution's layout map's (a model built abstractly has not initialised
    it); None without a distribution or a layout (replicated). A tensor has no layout to
    read: a LoRA layer's ``.kernel`` is the merged tensor, its variable is
    ``kernel_variable(layer)``."""
    if not isinstance(variable, keras.Variable):
        raise TypeError(
            f"weight_axes reads a Keras variable's layout, got a {type(variable).__name__} of shape "
            f"{tuple(variable.shape)}; for a LoRA-adapted layer pass kernel_variable(layer), not layer.kernel "
            f"(the merged kernel)"
        )
    distribution = keras.distribution.distribution()
    if distribution is None:
        return None
    layout = variable_layout(variable) or distribution.get_variable_layout(variable)
    axes = tuple(layout.spec) if isinstance(layout, jax.sharding.NamedSharding) else getattr(layout, "axes", None)
    return None if axes is None else tuple(axes) + (None,) * (len(variable.shape) - len(axes))


def _batch_axis(distribution, layer_batch_axis):
    axis = getattr(distribution, "batch_dim_name", None)
    if axis is None:
        return layer_batch_axis
    what = "ContextParallel distribution's" if isinstance(distribution, ContextParallel) else "distribution's"
    _check_agrees("batch_axis", layer_batch_axis, DATA, "batch_dim_name", axis, what)
    return axis


def _check_agrees(name, value, default, distribution_name, distribution_value, what="ContextParallel distribution's"):
    if value is not None and value != default and value != distribution_value:
        raise ValueError(
            f"attention layer {name}={value!r} conflicts with the {what} "
            f"{distribution_name}={distribution_value!r}, which decides how inputs are split and ordered; "
            f"leave {name} at its default {default!r} to follow the distribution"
        )


def _check_distinct(model_axis, *, batch, sequence, weight_shard):
    """Raise if the distribution splits something else over the tensor-parallel axis."""
    others = {
        batch: "the distribution splits the batch over mesh axis {axis!r}, the axis tensor parallelism splits "
        "features over; use another model_axis or batch axis",
        sequence: "the ContextParallel distribution splits the sequence over mesh axis {axis!r}, the axis tensor "
        "parallelism splits features over; use another model_axis or sequence axis",
        weight_shard: "the distribution splits weights FSDP-style over mesh axis {axis!r}, the axis tensor "
        "parallelism splits features over; use another weight_shard_axis or model_axis",
    }
    if model_axis in others:
        raise ValueError(others[model_axis].format(axis=model_axis))


def _split_axis(keras_mesh, axis):
    """``axis`` if the mesh has it with size > 1, else None."""
    if axis is None or axis not in keras_mesh.axis_names or mesh_axis_size(keras_mesh, axis) == 1:
        return None
    return axis


# --- the one shard_map cache ----------------------------------------------------------------


def run_sharded(plan, body, args, in_specs, out_specs, /, **settings):
    """``jax.shard_map(partial(body, **settings))(*args)`` over ``plan.mesh``.

    ``body`` is a module-level function or a layer's bound method; ``settings`` are
    hashable (a layer, the plan, strings, numbers). The jitted program is kept per
    (body, mesh, specs, settings): a second call with the same ones reuses it.
    """
    return run_on_mesh(plan.mesh, body, args, in_specs, out_specs, **settings)


def run_on_mesh(mesh, body, args, in_specs, out_specs, /, **settings):
    """``run_sharded`` on a ``jax.sharding.Mesh`` rather than a plan's (``zoo.layers.run_on_mesh``:
    the benchmarks that run a kernel under ``shard_map`` by itself, on a mesh of their own)."""
    program = _program(body, mesh, _freeze(in_specs), _freeze(out_specs), tuple(sorted(settings.items())))
    return program(*args)


def run_manual_over(plan, axes, body, args, in_specs, out_specs, /, **settings):
    """``run_sharded`` manual over the mesh axes ``axes`` only: the other axes stay GSPMD's
    inside ``body`` (the pipeline: manual over ``stage`` and the batch axis, the ``model``
    axis split by the layout map as outside it). Kept per (body, mesh, axes, specs, settings)."""
    frozen = (_freeze(in_specs), _freeze(out_specs), tuple(sorted(settings.items())))
    return _program(body, plan.mesh, *frozen, manual_axes=frozenset(axes))(*args)


def program_cache_info():
    """``functools.lru_cache`` statistics of ``run_sharded``'s programs (hits, misses, size)."""
    return _program.cache_info()


def _is_spec(x):
    return x is None or isinstance(x, P)


def _freeze(specs):
    """A hashable form of a pytree of ``PartitionSpec``s (dicts and lists included)."""
    leaves, tree = jax.tree.flatten(specs, is_leaf=_is_spec)
    return tuple(leaves), tree


@functools.lru_cache(maxsize=256)
def _program(body, mesh, in_specs, out_specs, settings, manual_axes=None):
    thaw = lambda frozen: jax.tree.unflatten(frozen[1], frozen[0])  # noqa: E731
    function = functools.partial(body, **dict(settings))
    manual = {} if manual_axes is None else {"axis_names": set(manual_axes)}  # default: every axis manual
    return jax.jit(jax.shard_map(function, mesh=mesh, in_specs=thaw(in_specs), out_specs=thaw(out_specs), **manual))
