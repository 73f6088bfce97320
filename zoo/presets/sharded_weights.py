"""Weights from a ``.weights.h5`` file straight into each variable's sharding.

Keras' ``model.load_weights`` assigns every variable with ``variable.assign(h5 dataset)``,
which converts the dataset with ``jnp.asarray``: the whole array lands on the default
device first and is only then re-laid out to the variable's sharding
(keras-team/keras#21634). For a model sharded because it does not fit on one device that
first copy is the problem.

Here Keras still walks the file and the layers (``load_own_variables`` of every layer,
``objects_to_skip``, its error messages); only the values change. While
``assign_from_host`` is active, each variable's (public) ``assign`` first turns a host
value (numpy, HDF5) into a ``jax.Array`` already laid out like the variable, with
``jax.make_array_from_callback(shape, variable.value.sharding, ...)``: each device
receives only its own slice, cut from the host value. Keras' own ``assign`` then
keeps that array as it is: its conversion returns a ``jax.Array`` of the variable's
dtype unchanged, and ``distribute_tensor`` skips the re-layout when the sharding is
already the variable's (checked on Keras 3.15.1 with JAX 0.10.2 and 0.12.0.1;
``tests/presets/test_sharded_loading.py`` fails if a whole split weight reaches a
device).
"""

import contextlib

import jax
import numpy as np


def sharded_value(variable, value):
    """``value`` (host array-like) as a ``jax.Array`` laid out like ``variable``, each
    device's slice put there from the host: no device holds more than its shard."""
    host = value if hasattr(value, "shape") and hasattr(value, "__getitem__") else np.asarray(value)
    if tuple(host.shape) != tuple(variable.shape):
        raise ValueError(
            f"variable {variable.path!r} has shape {tuple(variable.shape)} but the file holds {tuple(host.shape)}"
        )
    current = variable.value
    dtype = np.dtype(current.dtype)
    return jax.make_array_from_callback(
        tuple(variable.shape), current.sharding, lambda index: np.asarray(host[index]).astype(dtype, copy=False)
    )


@contextlib.contextmanager
def assign_from_host(variables):
    """While active, ``variable.assign(host_value)`` places each shard directly on its device.

    Values that are already ``jax.Array``s or variables (e.g. Keras' own ``ops.zeros``
    for LoRA factors) are assigned as Keras assigns them.
    """
    patched = []
    try:
        for variable in variables:
            variable.assign = _assign_sharded(variable, variable.assign)
            patched.append(variable)
        yield
    finally:
        for variable in patched:
            del variable.assign  # back to the class's assign


def _assign_sharded(variable, assign):
    def assign_sharded(value):
        if isinstance(value, jax.Array) or hasattr(value, "value"):  # device array or Keras variable
            return assign(value)
        return assign(sharded_value(variable, value))

    return assign_sharded


def load_weights_sharded(model, path, skip_layers=()):
    """``model.load_weights(path)`` with every shard put straight on its device.

    ``skip_layers``: layers whose weights are not loaded (they keep their values).
    """
    with assign_from_host(model.variables):
        model.load_weights(path, objects_to_skip=list(skip_layers) if skip_layers else None)
