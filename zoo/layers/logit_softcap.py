"""The causal LM's ``logits`` layer with Gemma 2's final-logit soft-capping."""

import keras


@keras.saving.register_keras_serializable(package="zoo")
class LogitSoftcap(keras.layers.Layer):
    """``softcap * tanh(logits / softcap)`` in float32 (transformers' ``final_logit_softcapping``).

    Takes the head's logits (B, T, V) in any dtype and returns float32 ones, as the plain
    ``logits`` layer does; it has no weights.
    """

    def __init__(self, softcap, **kwargs):
        super().__init__(**kwargs)
        self.softcap = float(softcap)

    def call(self, logits):
        logits = keras.ops.cast(logits, "float32")  # (B, T, V)
        return self.softcap * keras.ops.tanh(logits / self.softcap)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, logits):
        return keras.KerasTensor(logits.shape, dtype="float32")  # float32 whatever the policy

    def get_config(self):
        return {**super().get_config(), "softcap": self.softcap}
