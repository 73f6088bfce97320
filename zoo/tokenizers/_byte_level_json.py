"""``ByteTokenizer`` as Hugging Face files: a ``tokenizer.json`` the ``tokenizers`` library
and ``transformers``' ``PreTrainedTokenizerFast`` load, with the ByteTokenizer's ids.

The id scheme is the ByteTokenizer's: UTF-8 byte b is id b (256 ids), id 0 (NUL, never in
text) is the padding. The file is written by hand (no library needed to export), as
transformers' byte-level BPE with no merges:

- ``normalizer`` ``ByteLevel``: the text becomes its UTF-8 bytes, each as GPT-2's
  printable stand-in character (byte 0x20 is ``"Ġ"``, 0x41 is ``"A"``); the ``BPE``
  model without merges then maps each character to its id in ``vocab`` (stand-in of b -> b).
- byte 0 is the special added token ``"\\u0000"`` (``pad_token``), matched in the raw text
  before the normalizer, so a NUL still encodes to 0 while the text ``"Ā"`` (U+0100,
  byte 0's stand-in) encodes to its two bytes [196, 128], as the ByteTokenizer does;
  decoding with ``skip_special_tokens`` drops it, as the ByteTokenizer drops padding.
- ``decoder`` ``ByteLevel``: stand-ins back to bytes, invalid UTF-8 as U+FFFD (the
  ByteTokenizer's ``errors="replace"``). No pre-tokenizer, no post-processor: no token is
  added to the text, and whitespace is a byte like any other.

``tokenizer_config.json`` names ``PreTrainedTokenizerFast``, the pad token and the model's
inputs (``input_ids``, ``attention_mask``: a causal LM takes no ``token_type_ids``).
"""

import json
import os

from zoo.tokenizers.hf_tokenizer import CONFIG_FILE, MODEL_INPUTS, TOKENIZER_FILE

PAD_TOKEN = "\x00"  # byte 0: the ByteTokenizer's pad id, a special token in the file


def byte_stand_ins():
    """GPT-2's ``bytes_to_unicode``: {byte: printable character}. Printable Latin-1 bytes
    stand for themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD) are U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def tokenizer_json():
    """The ``tokenizer.json`` text (byte b -> id b, byte 0 the special pad token)."""
    stand_ins = byte_stand_ins()
    vocab = {(PAD_TOKEN if b == 0 else stand_ins[b]): b for b in range(256)}
    pad = {
        "id": 0,
        "content": PAD_TOKEN,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [pad],
        "normalizer": {"type": "ByteLevel"},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    return json.dumps(document, indent=2)


def tokenizer_config():
    """The ``tokenizer_config.json`` object."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": PAD_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_input_names": MODEL_INPUTS,
    }


def write_files(path):
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into the folder ``path``."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, TOKENIZER_FILE), "w", encoding="utf-8") as file:
        file.write(tokenizer_json())
        file.write("\n")
    with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as file:
        json.dump(tokenizer_config(), file, indent=2)
        file.write("\n")
