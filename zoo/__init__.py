"""keras-zoo: Keras 3 models on JAX that scale by changing the distribution layout.

Importing ``zoo`` selects the JAX backend for Keras (see ``zoo._backend``).
"""

from zoo._backend import BackendError, select_jax_backend

select_jax_backend()

__version__ = "0.1.0"

__all__ = ["BackendError", "__version__"]
