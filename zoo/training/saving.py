"""Loading saved zoo models: ``.keras`` files, always in Keras' safe mode."""

import os

import keras

import zoo.models  # noqa: F401  (registers the zoo's serialisable classes)


def load_zoo_model(path):
    """Load a ``.keras`` file with ``safe_mode=True``: a file carrying Python code (a
    ``Lambda`` layer's bytecode, say) is refused, never executed."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no saved model at {path!r}; train one first (e.g. zoo train gpt --output {path})")
    if not path.endswith(".keras"):
        raise ValueError(f"model path must end in .keras, got {path!r}")
    return keras.saving.load_model(path, safe_mode=True)
