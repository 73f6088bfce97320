"""What a compiled step communicates and how much memory it needs: the steps built and
compiled here (a jitted function with example arguments, a layer's forward or
forward+backward, a model's train step), the program read by ``zoo.measure.hlo`` (the
HLO parser: every collective with its loop trip counts, and the memory analysis; its
names are re-exported here).
"""

import jax
import keras

from zoo.distribution.distributions import place_batch
from zoo.measure.hlo import (
    COLLECTIVE_KINDS,
    FAST_COMPILE,
    CollectiveOp,
    CommsReport,
    MemoryUsage,
    loop_multiplicities,
    parse_collectives,
    report_of,
)
from zoo.measure.steps import model_state, stateless_train_step

__all__ = [
    "COLLECTIVE_KINDS",
    "FAST_COMPILE",
    "CollectiveOp",
    "CommsReport",
    "MemoryUsage",
    "comms_report",
    "compiled_report",
    "layer_comms_report",
    "layer_step",
    "loop_multiplicities",
    "parse_collectives",
    "train_step",
    "train_step_comms_report",
]


# --- compiling -------------------------------------------------------------------------


def compiled_report(compiled, mesh=None, *, hlo_text=None):
    """``CommsReport`` of an already compiled program (``jax.jit(f).lower(...).compile()``),
    its device groups named by ``mesh`` (default: the global Keras distribution's);
    ``hlo_text``: its ``as_text()`` when the caller already has it."""
    return report_of(compiled, _default_mesh(mesh), hlo_text=hlo_text)


def comms_report(fn, *args, mesh=None, compiler_options=None, **jit_options):
    """Compile ``fn(*args)`` with ``jax.jit`` and report its collectives and memory.

    ``args`` are example arguments (arrays, placed as the real ones would be, or
    ``jax.ShapeDtypeStruct``s with shardings); ``mesh`` names the axes (default: the
    global Keras distribution's mesh); ``compiler_options`` go to XLA (e.g.
    ``FAST_COMPILE``), ``jit_options`` to ``jax.jit``.
    """
    compiled = jax.jit(fn, **jit_options).lower(*args).compile(compiler_options)
    return compiled_report(compiled, mesh)


def _default_mesh(mesh):
    if mesh is not None:
        return mesh
    distribution = keras.distribution.distribution()
    return None if distribution is None else distribution.device_mesh


def _place_batch(arrays):
    """Host arrays onto the global distribution's data layout, as ``fit`` places them."""
    return place_batch(keras.distribution.distribution(), *arrays)


def layer_step(layer, *inputs, backward=False, seed=0):
    """``(step, example arguments)`` of ``layer``'s forward or forward + backward.

    The layer must be built. Host inputs are placed on the global distribution's data
    layout (placed ``jax.Array``s are kept). ``step(trainable, non_trainable, inputs)``
    returns the output; with ``backward=True``, ``step(trainable, non_trainable, inputs,
    key)`` returns the output and the gradients of ``sum(output * cotangent)`` with
    respect to the trainable weights and the inputs, the cotangent drawn from ``key``
    inside the program (so it is laid out as the output is, with no extra transfer).
    """
    inputs = _place_batch(inputs)
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def forward(trainable, non_trainable, inputs):
        return layer.stateless_call(trainable, non_trainable, *inputs)[0]

    if not backward:
        return forward, (trainable, non_trainable, inputs)

    def forward_backward(trainable, non_trainable, inputs, key):
        out, pullback = jax.vjp(lambda t, i: forward(t, non_trainable, i), trainable, inputs)
        cotangent = jax.random.normal(key, out.shape, out.dtype)
        return out, pullback(cotangent)

    return forward_backward, (trainable, non_trainable, inputs, jax.random.key(seed))


def layer_comms_report(layer, *inputs, backward=False, mesh=None, seed=0, compiler_options=None):
    """Collectives and memory of ``layer``'s forward (or forward + backward) pass (see ``layer_step``)."""
    step, args = layer_step(layer, *inputs, backward=backward, seed=seed)
    return comms_report(step, *args, mesh=mesh, compiler_options=compiler_options)


def train_step(model, x, y):
    """``(step, example arguments)`` of one optimizer step of a compiled Keras model.

    The step is ``zoo.measure.steps.stateless_train_step``: Keras' train step without
    metric updates, ``step(state, x, y) -> (loss, state)``. x, y (one batch) are placed
    on the global distribution's data layout, as ``fit`` places them.
    """
    step = stateless_train_step(model)  # refuses a model that is not compiled
    x, y = _place_batch([x, y])
    return step, (model_state(model), x, y)


def train_step_comms_report(model, x, y, mesh=None, compiler_options=None):
    """Collectives and memory of one optimizer step of a compiled Keras model (see ``train_step``)."""
    step, args = train_step(model, x, y)
    return comms_report(step, *args, mesh=mesh, compiler_options=compiler_options)
