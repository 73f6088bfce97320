"""Make sure Keras runs on JAX before anything in keras-zoo imports it.

keras-zoo is written for the JAX backend only (``shard_map`` kernels, JAX
shardings). Keras reads ``KERAS_BACKEND`` once, when it is first imported, so the
choice has to be made here, before ``import keras``.
"""

import os
import sys

REQUIRED_BACKEND = "jax"


class BackendError(RuntimeError):
    """Keras is (or will be) running on a backend other than JAX."""


def select_jax_backend():
    """Select JAX for Keras, or raise if another backend is already in force."""
    requested = os.environ.get("KERAS_BACKEND")
    if "keras" in sys.modules:
        _check_loaded_keras()
    elif requested and requested != REQUIRED_BACKEND:
        raise BackendError(
            f"KERAS_BACKEND={requested!r} but keras-zoo needs the "
            f"{REQUIRED_BACKEND!r} backend. Unset KERAS_BACKEND or set "
            f"KERAS_BACKEND={REQUIRED_BACKEND} before starting Python."
        )
    else:
        os.environ["KERAS_BACKEND"] = REQUIRED_BACKEND


def _check_loaded_keras():
    import keras

    loaded = keras.backend.backend()
    if loaded != REQUIRED_BACKEND:
        raise BackendError(
            f"Keras is already imported with the {loaded!r} backend, but "
            f"keras-zoo needs {REQUIRED_BACKEND!r}. Keras picks its backend once, "
            f"on first import: import zoo before keras, or set "
            f"KERAS_BACKEND={REQUIRED_BACKEND} in the environment before "
            f"starting Python."
        )
