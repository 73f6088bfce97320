"""keras-zoo: Keras 3 models on JAX that scale by changing the distribution layout.

Importing ``zoo`` selects the JAX backend for Keras (see ``zoo._backend``), then
imports every module that registers a Keras-serialisable class
(``@keras.saving.register_keras_serializable(package="zoo")``: the models, the layers,
the model-level layers such as ``ClassToken``, and ``ByteTokenizer``). So after
``import zoo`` alone, plain Keras loads any saved zoo object:
``keras.saving.load_model("small_cnn.keras", safe_mode=True)``, or a preset's
``config.json`` with ``keras.saving.deserialize_keras_object``. Keras finds a class by
its registered name (``"zoo>SmallCNN"``) and imports the ``module`` a config names only
for its own packages (``keras``, ``keras_hub``), never ``zoo``.

The package root is the one module that imports every part of the zoo; the parts
themselves import one way only (``tests/test_architecture.py`` checks each package, not
this file). Importing any ``zoo`` module runs this file first, so each one brings
Keras and the models with it, except in the ``zoo`` command itself: there the command
line is parsed first (``zoo --help`` and a mistyped flag answer without JAX, from
``zoo.config``) and ``load_all()`` runs once a command starts.
"""

import os
import sys

from zoo._backend import BackendError, select_jax_backend

select_jax_backend()  # before anything below imports Keras

from zoo._version import __version__  # the one home of the version (zoo/_version.py)


def load_all():
    """Import every module that registers a Keras-serialisable class (``tests/test_loading.py``
    fails if a registered class is missed); returns the four packages."""
    from zoo import data, layers, models, presets
    from zoo.training import optimizers  # noqa: F401 (zoo>AdamW, saved with a compiled model)

    return data, layers, models, presets


def _started_as_command():
    """Whether this process is the ``zoo`` console script (or ``python -m zoo``)."""
    script = os.path.basename(getattr(sys.modules.get("__main__"), "__file__", None) or "")
    return script == "zoo" or list(getattr(sys, "orig_argv", [])[1:3]) == ["-m", "zoo"]


if not _started_as_command():
    data, layers, models, presets = load_all()

__all__ = ["BackendError", "__version__", "data", "layers", "load_all", "models", "presets"]
