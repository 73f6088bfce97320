"""``dtype_policy_scope``: Keras' global dtype policy set while a block builds a model."""

import contextlib

import keras


@contextlib.contextmanager
def dtype_policy_scope(policy):
    """Keras' global dtype policy set to ``policy`` (a name, a policy or a ``DTypePolicyMap``)
    while the block builds a model (its layers keep it), the previous one restored after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
