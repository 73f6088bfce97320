"""Tokenizers: text <-> int32 token ids, with keras-hub's names for the special ids.

- ``Tokenizer``: the interface every zoo tokenizer offers (``encode``, ``decode``,
  ``vocabulary_size``, ``start_token_id`` / ``end_token_id`` / ``pad_token_id``,
  ``stop_token_ids``, ``token_to_id`` / ``id_to_token``, ``get_config``).
- ``ByteTokenizer``: one token per UTF-8 byte (the byte-level presets and datasets).
- ``HFTokenizer``: a Hugging Face ``tokenizer.json`` through the ``tokenizers`` library
  (``pip install "keras-zoo[hf]"``; imported only when an ``HFTokenizer`` is built).
- ``ChatTemplate``: a model's Jinja chat template rendered as ``transformers``'
  ``apply_chat_template`` renders it (``jinja2``, in the ``[hf]`` extra); ``zoo.tokenizers.chat``
  gives the token ids and the assistant-only loss mask (docs/chat.md).

This package sits below ``zoo.models`` and ``zoo.data`` and imports no other zoo package
than ``zoo.config`` (``tests/test_architecture.py``).
"""

from zoo.tokenizers.byte_tokenizer import ByteTokenizer
from zoo.tokenizers.chat_template import ChatTemplate
from zoo.tokenizers.hf_tokenizer import HFTokenizer
from zoo.tokenizers.tokenizer import Tokenizer

__all__ = ["ByteTokenizer", "ChatTemplate", "HFTokenizer", "Tokenizer"]
