"""``ByteTokenizer``: UTF-8 bytes are the tokens. Keras-serialisable (``"zoo>ByteTokenizer"``)."""

import os

import keras
import numpy as np

from zoo.tokenizers import _byte_level_json
from zoo.tokenizers.tokenizer import Tokenizer

VOCABULARY_SIZE = 256


@keras.saving.register_keras_serializable(package="zoo")
class ByteTokenizer(Tokenizer):
    """Text <-> token ids, one id per UTF-8 byte (vocabulary of 256).

    Id 0 (the NUL byte, which never occurs in text) doubles as padding (``pad_token_id``);
    there is no start or end token (``start_token_id`` / ``end_token_id`` are None,
    ``stop_token_ids`` is empty). Decoding drops padding and replaces invalid UTF-8 (e.g. a
    multi-byte character cut by a sequence boundary) with U+FFFD. A token is the
    one-character string ``chr(id)`` (Latin-1: byte 0xE9 is ``"é"``), so
    ``token_to_id``/``id_to_token`` invert each other over all 256 ids.
    ``save_to_directory`` writes it as a Hugging Face byte-level ``tokenizer.json`` with
    the same ids (``zoo.tokenizers._byte_level_json``).

    Args:
        sequence_length: when set, ``encode`` pads or truncates to this length, and a list
            of texts gives one ``(N, sequence_length)`` array.
    """

    vocabulary_size = VOCABULARY_SIZE
    pad_token_id = 0

    def __init__(self, sequence_length=None):
        if sequence_length is not None and sequence_length < 1:
            raise ValueError(f"sequence_length must be positive, got {sequence_length}")
        self.sequence_length = sequence_length

    def token_to_id(self, token):
        if not isinstance(token, str) or len(token) != 1 or ord(token) >= VOCABULARY_SIZE:
            raise ValueError(f"a ByteTokenizer token is one character with code < {VOCABULARY_SIZE}, got {token!r}")
        return ord(token)

    def id_to_token(self, token_id):
        return chr(self._check_id(token_id))

    def get_config(self):
        return {"sequence_length": self.sequence_length}

    def save_to_directory(self, path):
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (``transformers``'
        ``PreTrainedTokenizerFast``; ``HFTokenizer.from_directory`` reads them back):
        byte b is id b, id 0 the pad token, as here. No library is needed to write them."""
        _byte_level_json.write_files(os.fspath(path))

    def _encode_one(self, text):
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def _decode_one(self, ids):
        return bytes(ids.astype(np.uint8)).decode("utf-8", errors="replace")
