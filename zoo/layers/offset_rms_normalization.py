"""``OffsetRMSNormalization``: RMSNorm whose weight is an offset from 1 (Gemma's norm)."""

import keras


@keras.saving.register_keras_serializable(package="zoo")
class OffsetRMSNormalization(keras.layers.RMSNormalization):
    """``x / sqrt(mean(x^2) + epsilon) * (1 + scale)`` over the last axis.

    Gemma's ``RMSNorm`` (transformers' ``Gemma2RMSNorm`` / ``Gemma3RMSNorm``, keras-hub's
    Gemma): the stored weight ``scale`` (C,) starts at zero and the norm multiplies by
    ``1 + scale``, computed in float32 as transformers does; the result is cast to the
    compute dtype. Same variable path as ``keras.layers.RMSNormalization``
    (``<name>/scale``), so the layout rules of either match it.
    """

    def build(self, input_shape):
        self.axis = [-1]
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="zeros")
        self.built = True

    def call(self, x):
        one_plus = 1.0 + keras.ops.cast(self.scale, "float32")  # f32[C]
        y = keras.ops.rms_normalization(keras.ops.cast(x, "float32"), scale=one_plus, axis=-1, epsilon=self.epsilon)
        return keras.ops.cast(y, self.compute_dtype)
