"""``LearnedPositionEmbedding``: adds a learned vector per position (BERT, ViT)."""

import keras


@keras.saving.register_keras_serializable(package="zoo")
class LearnedPositionEmbedding(keras.layers.Layer):
    """``x + E[:T]``: a learned table ``E`` of shape (sequence_length, C), one row per position.

    Args:
        sequence_length: L, the longest sequence the table covers; inputs may be shorter.
        initializer: for the table (truncated normal, stddev 0.02, as in BERT and ViT).

    Call: x (B, T, C) with T <= L -> (B, T, C). Weight: ``<name>/embeddings`` (L, C).
    """

    def __init__(self, sequence_length, initializer=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(sequence_length, int) or isinstance(sequence_length, bool) or sequence_length < 1:
            raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}")
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer or keras.initializers.TruncatedNormal(stddev=0.02))

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                f"{self.name}: expects inputs (batch, length, channels) with channels known, got {tuple(input_shape)}"
            )
        self.embeddings = self.add_weight(
            shape=(self.sequence_length, input_shape[-1]), initializer=self.initializer, name="embeddings"
        )  # (L, C)

    def call(self, x):
        length = x.shape[1]
        if length is not None and length > self.sequence_length:
            raise ValueError(
                f"{self.name}: sequence length {length} exceeds the {self.sequence_length} positions "
                f"this embedding was built for"
            )
        return x + keras.ops.expand_dims(self.embeddings[:length], 0)  # (B, T, C) + (1, T, C)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(sequence_length=self.sequence_length, initializer=keras.initializers.serialize(self.initializer))
        return config
