"""``ClassToken``: prepends one learned token to a sequence (BERT's [CLS], ViT's class token)."""

import keras


@keras.saving.register_keras_serializable(package="zoo")
class ClassToken(keras.layers.Layer):
    """Prepends a learned (1, 1, C) vector to every sequence of the batch.

    Args:
        initializer: for the token (zeros, as in ViT).

    Call: x (B, T, C) -> (B, 1 + T, C), the token first. Weight: ``<name>/token`` (1, 1, C).
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                f"{self.name}: expects inputs (batch, length, channels) with channels known, got {tuple(input_shape)}"
            )
        self.token = self.add_weight(
            shape=(1, 1, input_shape[-1]), initializer=self.initializer, name="token"
        )  # (1, 1, C)

    def call(self, x):
        batch, channels = keras.ops.shape(x)[0], x.shape[-1]
        token = keras.ops.broadcast_to(keras.ops.cast(self.token, x.dtype), (batch, 1, channels))  # (B, 1, C)
        return keras.ops.concatenate([token, x], axis=1)  # (B, 1 + T, C)

    def compute_output_shape(self, input_shape):
        batch, length, channels = input_shape
        return (batch, None if length is None else length + 1, channels)

    def get_config(self):
        config = super().get_config()
        config.update(initializer=keras.initializers.serialize(self.initializer))
        return config
