"""``Tokenizer``: the interface every zoo tokenizer offers (keras-hub's names for the special ids)."""

import numpy as np


class Tokenizer:
    """Text <-> int32 token ids.

    - ``encode(text)``: ``str -> int32 (T,)``; a list of strings gives a list of such arrays,
      or one ``(N, sequence_length)`` array when the tokenizer has a ``sequence_length``
      (each row padded with ``pad_token_id`` or truncated).
    - ``decode(ids)``: ``int (T,) -> str``, special tokens and padding skipped; ``(N, T)``
      gives a list of strings.
    - ``start_token_id``, ``end_token_id``, ``pad_token_id``: the special ids, None when the
      tokenizer has no such token; ``stop_token_ids``: the ids that end generation (a tuple).
    - ``token_to_id(token)`` / ``id_to_token(id)``: one token's id and back.

    A subclass sets ``vocabulary_size`` and the special ids, implements ``_encode_one``,
    ``_decode_one``, ``token_to_id``, ``id_to_token`` and ``get_config``, and is registered
    with ``keras.saving.register_keras_serializable(package="zoo")``.
    """

    vocabulary_size = None  # V: token ids are in [0, V)
    start_token_id = None
    end_token_id = None
    pad_token_id = None
    stop_token_ids = ()
    sequence_length = None  # when set, encode pads or truncates to this length

    def encode(self, text):
        """``str -> int32 (T,)``; a list of strings gives a list, or ``(N, sequence_length)``."""
        if isinstance(text, str):
            return self._fit_length(self._encode_one(text))
        texts = list(text)
        for index, item in enumerate(texts):
            if not isinstance(item, str):
                raise TypeError(f"encode takes a string or a list of strings; item {index} is a {type(item).__name__}")
        rows = [self._fit_length(ids) for ids in self._encode_many(texts)]
        if self.sequence_length is None:
            return rows
        return np.stack(rows) if rows else np.zeros((0, self.sequence_length), np.int32)

    def decode(self, ids):
        """``int (T,) -> str`` (special tokens and padding skipped); ``(N, T)`` gives a list of strings."""
        ids = np.asarray(ids)
        if ids.ndim > 1:
            return [self.decode(row) for row in ids]
        ids = ids.reshape(-1)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"token ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocabulary_size):
            raise ValueError(f"token ids must be in [0, {self.vocabulary_size}), got range [{ids.min()}, {ids.max()}]")
        if self.pad_token_id is not None:
            ids = ids[ids != self.pad_token_id]
        return self._decode_one(ids)

    def token_to_id(self, token):
        """The id of one token (a ``ValueError`` when the vocabulary lacks it)."""
        raise NotImplementedError

    def id_to_token(self, token_id):
        """The token of one id (a ``ValueError`` when it is not in ``[0, vocabulary_size)``)."""
        raise NotImplementedError

    def get_config(self):
        raise NotImplementedError

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def _encode_one(self, text):
        """``str -> int32 (T,)``, unpadded."""
        raise NotImplementedError

    def _encode_many(self, texts):
        """``[str] -> [int32 (T_i,)]``, unpadded; a library may do a batch at once."""
        return [self._encode_one(text) for text in texts]

    def _decode_one(self, ids):
        """``int64 (T,)`` in range, padding already removed -> ``str``."""
        raise NotImplementedError

    def _fit_length(self, ids):
        ids = np.asarray(ids, dtype=np.int32)
        if self.sequence_length is None:
            return ids
        ids = ids[: self.sequence_length]
        pad = 0 if self.pad_token_id is None else self.pad_token_id
        return np.pad(ids, (0, self.sequence_length - len(ids)), constant_values=pad)

    def _check_id(self, token_id):
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < self.vocabulary_size:
            raise ValueError(f"token id {token_id!r} is not in [0, {self.vocabulary_size})")
        return int(token_id)
