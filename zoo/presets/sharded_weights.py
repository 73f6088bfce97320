"""Weights from a ``.weights.h5`` file straight into each variable's sharding.

Keras' ``model.load_weights`` assigns every variable with ``variable.assign(h5 dataset)``,
which converts the dataset with ``jnp.asarray``: the whole array lands on the default
device first and is only then re-laid out to the variable's sharding
(keras-team/keras#21634). For a model sharded because it does not fit on one device that
first copy is the problem.

Here Keras still walks the file and the layers (``load_own_variables`` of every layer,
``objects_to_skip``, its error messages), but while ``assign_from_host`` is active each
variable converts the value it is given on the host (numpy) and hands it to
``jax.device_put(value, variable.value.sharding)``: every device receives only its own
shard. Keras' ``distribute_tensor`` then sees the layout is already right and keeps the
array as it is.
"""

import contextlib
import functools

import jax
import numpy as np

_CONVERT = "_convert_to_tensor"  # JaxVariable.assign converts its value with this method


@contextlib.contextmanager
def assign_from_host(variables):
    """While active, ``variable.assign(host_value)`` places each shard directly on its device.

    Values that are already ``jax.Array``s (e.g. Keras' own ``ops.zeros``) are converted
    as Keras converts them.
    """
    patched = []
    try:
        for variable in variables:
            if not callable(getattr(type(variable), _CONVERT, None)):
                raise RuntimeError(
                    f"{type(variable).__name__} has no {_CONVERT} method; this Keras version assigns "
                    f"variables differently and zoo.presets' sharded loading needs updating"
                )
            setattr(variable, _CONVERT, functools.partial(_place_like, variable))
            patched.append(variable)
        yield
    finally:
        for variable in patched:
            delattr(variable, _CONVERT)


def _place_like(variable, value, dtype=None):
    """``value`` as a ``jax.Array`` laid out like ``variable``, put there from the host."""
    if isinstance(value, jax.Array) or hasattr(value, "value"):  # device array or Keras variable
        return type(variable)._convert_to_tensor(variable, value, dtype=dtype)
    host = np.asarray(value)
    target = np.dtype(jax.numpy.dtype(dtype or variable.dtype))
    if tuple(host.shape) != tuple(variable.shape):
        raise ValueError(f"variable {variable.path!r} has shape {tuple(variable.shape)} but the file holds {tuple(host.shape)}")
    return jax.device_put(host.astype(target, copy=False), variable.value.sharding)


def load_weights_sharded(model, path, skip_layers=()):
    """``model.load_weights(path)`` with every shard put straight on its device.

    ``skip_layers``: layers whose weights are not loaded (they keep their values).
    """
    with assign_from_host(model.variables):
        model.load_weights(path, objects_to_skip=list(skip_layers) if skip_layers else None)
