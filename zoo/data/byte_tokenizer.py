"""A byte-level tokenizer: UTF-8 bytes are the tokens. Keras-serialisable."""

import keras
import numpy as np

VOCABULARY_SIZE = 256


@keras.saving.register_keras_serializable(package="zoo")
class ByteTokenizer:
    """Text <-> token ids, one id per UTF-8 byte (vocabulary of 256).

    Id 0 (the NUL byte, which never occurs in text) doubles as padding. Decoding
    drops padding and replaces invalid UTF-8 (e.g. a multi-byte character cut by a
    sequence boundary) with U+FFFD.

    Args:
        sequence_length: when set, ``encode`` pads or truncates to this length.
    """

    vocabulary_size = VOCABULARY_SIZE
    pad_id = 0

    def __init__(self, sequence_length=None):
        if sequence_length is not None and sequence_length < 1:
            raise ValueError(f"sequence_length must be positive, got {sequence_length}")
        self.sequence_length = sequence_length

    def encode(self, text):
        """``str -> int32 (T,)``; a list of strings gives ``(N, sequence_length)`` (needs a length)."""
        if isinstance(text, str):
            return self._fit_length(np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32))
        if self.sequence_length is None:
            raise ValueError("encoding a batch of texts needs sequence_length (texts differ in length)")
        return np.stack([self.encode(t) for t in text])

    def decode(self, ids):
        """``int (T,) -> str``; ``(N, T)`` gives a list of strings."""
        ids = np.asarray(ids)
        if ids.ndim > 1:
            return [self.decode(row) for row in ids]
        if ids.size and (ids.min() < 0 or ids.max() >= VOCABULARY_SIZE):
            raise ValueError(f"token ids must be in [0, {VOCABULARY_SIZE}), got range [{ids.min()}, {ids.max()}]")
        return bytes(ids[ids != self.pad_id].astype(np.uint8)).decode("utf-8", errors="replace")

    def _fit_length(self, ids):
        if self.sequence_length is None:
            return ids
        ids = ids[: self.sequence_length]
        return np.pad(ids, (0, self.sequence_length - len(ids)), constant_values=self.pad_id)

    def get_config(self):
        return {"sequence_length": self.sequence_length}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
