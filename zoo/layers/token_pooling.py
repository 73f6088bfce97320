"""``TokenPooling``: one vector per sequence, from the first token or a masked mean."""

import keras

from zoo.config.choices import POOLINGS


@keras.saving.register_keras_serializable(package="zoo")
class TokenPooling(keras.layers.Layer):
    """Pools (B, T, C) token features to (B, C).

    Args:
        mode: ``"cls"`` takes the first token (a prepended class token); ``"mean"``
            averages the tokens whose ``key_mask`` is True (all tokens without a mask).
            A sequence with no kept token pools to zeros.

    Call: ``pooling(x, key_mask=None)``; x (B, T, C), key_mask bool (B, T) -> (B, C).
    """

    def __init__(self, mode="mean", **kwargs):
        super().__init__(**kwargs)
        if mode not in POOLINGS:
            raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {mode!r}")
        self.mode = mode

    def call(self, x, key_mask=None):
        if self.mode == "cls":
            return x[:, 0, :]  # (B, C)
        if key_mask is None:
            return keras.ops.mean(x, axis=1)  # (B, C)
        weights = keras.ops.expand_dims(keras.ops.cast(key_mask, x.dtype), -1)  # (B, T, 1)
        total = keras.ops.sum(x * weights, axis=1)  # (B, C)
        count = keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)  # (B, 1)
        return total / count  # (B, C)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(mode=self.mode)
        return config
