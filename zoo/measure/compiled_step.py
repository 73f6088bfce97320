"""Compile, never run, the training step ``model.fit`` runs, for a model built abstractly.

Real size is checked by compiling: the model is built inside
``keras.StatelessScope(initialize_variables=False)`` (every variable has its path,
shape, dtype and layout, nothing is allocated), the optimizer's slots likewise, and
Keras' own ``model.train_step(state, data)`` (the function ``fit`` jits) is lowered
with ``jax.ShapeDtypeStruct`` arguments carrying each variable's sharding and the
batch's data layout, then compiled for the mesh's devices (simulated CPU devices
work: ``--xla_force_host_platform_device_count``). The compiled program's
``memory_analysis()`` gives per-device argument, output and temporary bytes; its HLO
gives the collectives (``zoo.measure.comms_report``).

Per device, a step needs the training state (weights, optimizer slots: arguments,
donated and aliased to the outputs) plus the temporaries (activations kept for the
backward pass, the gradients, workspace). ``StepMemory`` splits the state by kind from
the variables' shardings (exact) and takes the temporaries from the compiler.

XLA:CPU plans buffers like the GPU and TPU compilers but schedules differently; its
temporary bytes are an estimate of theirs (docs/performance.md says by how much where
a device was available to measure).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zoo._compat import (
    build_compile_state,
    forgetting_deferred_variables,
    variable_layout,
)
from zoo.config.choices import PINNED_HOST
from zoo.distribution.distributions import global_distribution
from zoo.distribution.layouts import raise_if_unmatched

__all__ = [
    "StepMemory",
    "abstract_build",
    "analytic_weight_bytes",
    "compile_fit_step",
    "memory_analysis_reflects_remat",
    "state_bytes",
    "state_shardings",
]


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes per device of one compiled training step."""

    weights: int  # the model's variables under their layouts
    gradients: int  # one per trainable weight, laid out like it (inside ``temp``)
    optimizer: int  # optimizer slots and scalars
    temp: int  # the compiler's temporaries: activations, gradients, workspace
    argument: int  # the compiler's argument bytes in device memory (state + batch)
    output: int  # the compiler's output bytes in device memory
    alias: int  # outputs that reuse an argument's buffer (the donated state)
    host: int = 0  # the optimizer state held in host memory (``AdamW(state_memory="host")``): not in the above

    @property
    def state(self):
        """Weights + optimizer state in device memory: what stays on the device between steps."""
        return self.weights + self.optimizer - self.host

    @property
    def peak(self):
        """Arguments + outputs not aliased to them + temporaries: the step's footprint."""
        return self.argument + self.output - self.alias + self.temp


def abstract_build(build, compile_model, distribution):
    """``build()`` and ``compile_model(model)`` under ``distribution`` with no weight or
    optimizer slot allocated; returns the compiled model (variables uninitialised).
    Raises ``LayoutError`` if a rule of the distribution's layout map matched no variable."""
    with (
        forgetting_deferred_variables(),
        global_distribution(distribution),
    ):  # else the next symbolic call allocates it all
        with keras.StatelessScope(initialize_variables=False):
            model = build()
        if hasattr(distribution, "unmatched_rules"):  # a layout rule that matched no variable is an error
            for variable in model.variables:  # deferred: nothing has asked for the layouts yet
                layout_under(variable, distribution)
            raise_if_unmatched(distribution.unmatched_rules(), model)
        with global_distribution(None):  # the optimizer's scalars are created for real, on the default device
            compile_model(model)
        with keras.StatelessScope(initialize_variables=False):
            model.optimizer.build(model.trainable_variables)
    return model


def _sharding(layout, mesh):
    """A ``NamedSharding`` on ``mesh`` (a jax Mesh) for a Keras layout (None: replicated)."""
    if isinstance(layout, jax.sharding.Sharding):
        return layout
    axes = getattr(layout, "axes", None) or ()
    return NamedSharding(mesh, P(*axes))


def layout_under(variable, distribution):
    """The layout Keras gives ``variable`` when it is initialised under ``distribution``:
    one set at creation (the zoo's parallel layers), else the distribution's (None:
    replicated, or no distribution)."""
    layout = variable_layout(variable)
    if layout is None and distribution is not None:
        layout = distribution.get_variable_layout(variable)
    return layout


def _variable_sharding(variable, distribution, mesh):
    return _sharding(layout_under(variable, distribution), mesh)


def slot_references(slots, trainable):
    """The trainable variable each of ``slots`` (optimizer slots) was made from (its path,
    ``/`` as ``_``, prefixes the slot's name; same shape), or None for the optimizer's own
    scalars; the trainable variables' names read once (a 70B model's 2,240 LoRA slots
    against its 1,120 factors: one pass, not one a slot)."""
    prefixes = sorted(((v.path.replace("/", "_") + "_", v) for v in trainable), key=lambda p: -len(p[0]))
    return [
        next(
            (v for prefix, v in prefixes if slot.name.startswith(prefix) and tuple(slot.shape) == tuple(v.shape)), None
        )
        for slot in slots
    ]


def state_groups(model):
    """The four variable groups of ``fit``'s step state, in its order: trainable,
    non-trainable, optimizer, metrics (``state_shardings`` gives their shardings)."""
    return (
        model.trainable_variables,
        model.non_trainable_variables,
        model.optimizer.variables,
        model.metrics_variables,
    )


def state_shardings(model, distribution):
    """Shardings of ``(trainable, non_trainable, optimizer, metrics)`` variables, as Keras
    lays them out once initialised (a slot takes its weight's layout, in host memory where
    the optimizer keeps it there: ``AdamW.host_slots``)."""
    trainable, non_trainable, optimizer, metrics = _device_shardings(model, distribution)
    host = {id(slot) for slot in getattr(model.optimizer, "host_slots", list)()}
    optimizer = [
        sharding.with_memory_kind(PINNED_HOST) if id(slot) in host else sharding
        for slot, sharding in zip(model.optimizer.variables, optimizer)
    ]
    return trainable, non_trainable, optimizer, metrics


def _device_shardings(model, distribution):
    """``state_shardings`` all in device memory."""
    if distribution is None:
        single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return tuple([single] * len(group) for group in state_groups(model))
    mesh = distribution.device_mesh.backend_mesh
    shard = lambda v: _variable_sharding(v, distribution, mesh)
    trainable = [shard(v) for v in model.trainable_variables]
    non_trainable = [shard(v) for v in model.non_trainable_variables]
    by_id = {id(v): s for v, s in zip(model.trainable_variables, trainable)}
    references = slot_references(model.optimizer.variables, model.trainable_variables)
    optimizer = [by_id[id(ref)] if ref is not None else NamedSharding(mesh, P()) for ref in references]
    metrics = [NamedSharding(mesh, P()) for _ in model.metrics_variables]
    return trainable, non_trainable, optimizer, metrics


def host_state_bytes(model, shardings):
    """Bytes per device of the optimizer state ``state_shardings`` puts in host memory."""
    optimizer = shardings[2]
    return sum(shard_bytes(v, s) for v, s in zip(model.optimizer.variables, optimizer) if s.memory_kind == PINNED_HOST)


def state_bytes(model, shardings):
    """``(weights, gradients, optimizer)`` bytes per device under ``state_shardings``."""
    trainable, non_trainable, optimizer, _ = shardings

    def total(variables, layouts):
        return sum(shard_bytes(v, s) for v, s in zip(variables, layouts))

    gradients = total(model.trainable_variables, trainable)
    weights = gradients + total(model.non_trainable_variables, non_trainable)
    return weights, gradients, total(model.optimizer.variables, optimizer)


def _abstract(variable, sharding):
    return jax.ShapeDtypeStruct(tuple(variable.shape), jax.numpy.dtype(variable.dtype), sharding=sharding)


def shard_bytes(variable, sharding):
    """Bytes of ``variable`` one device holds under ``sharding``."""
    shape = sharding.shard_shape(tuple(variable.shape)) if variable.shape else ()
    return math.prod(shape) * jax.numpy.dtype(variable.dtype).itemsize


def batch_specs(part):
    """One part of a batch, given as ``(shape, dtype)`` or as arrays (any nesting), as
    ``jax.ShapeDtypeStruct``s in the same nesting."""
    if isinstance(part, tuple) and len(part) == 2 and isinstance(part[1], str):
        return jax.ShapeDtypeStruct(tuple(part[0]), jax.numpy.dtype(part[1]))
    return keras.tree.map_structure(lambda a: jax.ShapeDtypeStruct(tuple(a.shape), a.dtype), part)


def _batch_struct(shape, dtype, distribution):
    if distribution is None:
        return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype))
    layout = distribution.get_data_layout(shape)
    return jax.ShapeDtypeStruct(
        shape, jax.numpy.dtype(dtype), sharding=_sharding(layout, distribution.device_mesh.backend_mesh)
    )


def compile_fit_step(model, distribution, x, y, *, sample_weight=None, compiler_options=None):
    """``(compiled, StepMemory)`` of ``model.train_step`` for one batch.

    ``model`` comes from ``abstract_build`` (or is an ordinary compiled model);
    ``x``, ``y`` (and ``sample_weight``, if fit gets one) are ``(shape, dtype)`` of one
    global batch, or one batch's arrays (any nesting: a dict of inputs, say). The step is
    jitted as ``fit`` jits it: the state donated, its outputs laid out like its inputs.
    """
    parts = [batch_specs(part) for part in (x, y, sample_weight) if part is not None]
    # the compiled metrics' variables (e.g. accuracy), as fit's first batch makes them; scalars, replicated
    with global_distribution(None):
        build_compile_state(model, *parts[:2])
    shardings = state_shardings(model, distribution)
    host = host_state_bytes(model, shardings)
    # One device and no host memory: no sharding given, as fit's first call has none (its
    # arrays uncommitted), so this is fit's own program (a persistent-cache hit, not a second
    # compile of minutes at 8B on a TPU)
    given = shardings if distribution is not None or host else [[None] * len(group) for group in shardings]
    state = tuple(
        [_abstract(v, s) for v, s in zip(group, group_shardings)]
        for group, group_shardings in zip(state_groups(model), given)
    )
    data = tuple(
        keras.tree.map_structure(lambda spec: _batch_struct(spec.shape, spec.dtype, distribution), part)
        for part in parts
    )
    out_shardings = None if distribution is None else (None, shardings)
    with global_distribution(distribution):
        step = jax.jit(model.train_step, donate_argnums=0, out_shardings=out_shardings)
        compiled = step.lower(state, data).compile(compiler_options)
    analysis = compiled.memory_analysis()
    weights, gradients, optimizer = state_bytes(model, shardings)
    # A TPU's or GPU's analysis counts host-memory arguments apart; XLA:CPU's (one memory)
    # counts them with the rest: take them out, in and out of the step alike (donated).
    lumped = host if not getattr(analysis, "host_argument_size_in_bytes", 0) else 0
    memory = StepMemory(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        temp=int(analysis.temp_size_in_bytes),
        argument=int(analysis.argument_size_in_bytes) - lumped,
        output=int(analysis.output_size_in_bytes) - lumped,
        alias=max(int(analysis.alias_size_in_bytes) - lumped, 0),
        host=host,
    )
    return compiled, memory


def analytic_weight_bytes(model, devices):
    """params x bytes / devices: the per-device weight bytes of a perfect split."""
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights) / devices


@functools.cache
def memory_analysis_reflects_remat():
    """Whether this XLA's ``memory_analysis()`` shows what ``jax.checkpoint`` saves.

    A probe: 8 blocks of ``x + sin(tanh(x @ a) * 2) @ b`` at (4096, 512) x (512, 2048),
    gradient compiled with and without ``jax.checkpoint`` on each block. XLA:CPU of
    JAX 0.12 keeps only each block's input (136 vs 616 MiB of temporaries); that of
    JAX 0.10 schedules the recomputation with the forward pass (608 vs 616 MiB), so a
    remat step's memory cannot be read from a CPU compile there.
    """

    def block(x, w):
        return x + jnp.sin(jnp.tanh(x @ w[0]) * 2) @ w[1]  # (4096, 512)

    def loss(weights, x, remat):
        for w in weights:
            x = (jax.checkpoint(block) if remat else block)(x, w)
        return jnp.sum(x * x)

    weights = [(jax.ShapeDtypeStruct((512, 2048), jnp.float32), jax.ShapeDtypeStruct((2048, 512), jnp.float32))] * 8
    x = jax.ShapeDtypeStruct((4096, 512), jnp.float32)
    temp = [
        jax.jit(jax.grad(functools.partial(loss, remat=remat)))
        .lower(weights, x)
        .compile()
        .memory_analysis()
        .temp_size_in_bytes
        for remat in (False, True)
    ]
    return temp[1] < 0.5 * temp[0]
