"""Activations the zoo's MLPs take by name that Keras has no string for."""

import keras


@keras.saving.register_keras_serializable(package="zoo")
def gelu_tanh(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's
    ``gelu(approximate="tanh")``, transformers' ``gelu_pytorch_tanh``: Gemma's GeGLU)."""
    return keras.activations.gelu(x, approximate=True)
