"""``HFTokenizer``: a Hugging Face ``tokenizer.json`` through the ``tokenizers`` library.

Keras-serialisable (``"zoo>HFTokenizer"``): its config holds the ``tokenizer.json`` text
itself, so a ``.keras`` file or a preset's ``tokenizer.json`` carries the whole tokenizer.
The library is imported when an ``HFTokenizer`` is built, not with this module.
"""

import json
import os

import keras
import numpy as np

from zoo.file_kinds import read_json_file, regular_file
from zoo.tokenizers import chat
from zoo.tokenizers.chat_template import ChatTemplate
from zoo.tokenizers.tokenizer import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
GENERATION_FILE = "generation_config.json"
MAX_TOKENIZER_JSON_BYTES = 64 << 20  # a tokenizer_config.json with 256k added tokens is a few MiB
MODEL_INPUTS = ["input_ids", "attention_mask"]  # transformers' model_input_names: a causal LM takes no token_type_ids


@keras.saving.register_keras_serializable(package="zoo")
class HFTokenizer(Tokenizer):
    """A Hugging Face fast tokenizer (``tokenizer.json``): BPE, WordPiece, Unigram, ...

    ``encode`` runs the library's whole pipeline, its post-processor included when
    ``add_special_tokens`` (Llama 3's prepends ``<|begin_of_text|>``; GPT-2's adds
    nothing); padding and truncation settings stored in the JSON are switched off, as
    ``transformers`` does by default. ``decode`` skips special tokens (the library's, and
    the start, end and pad tokens named here).

    Args:
        tokenizer_json: the text of a ``tokenizer.json``.
        start_token, end_token, pad_token: the special tokens (strings in the vocabulary),
            or None; their ids are ``start_token_id``, ``end_token_id``, ``pad_token_id``.
        stop_tokens: more tokens that end generation (an instruct model's end-of-turn
            token); ``stop_token_ids`` holds the end token's id and theirs.
        add_special_tokens: whether ``encode`` runs the post-processor.
        clean_up_tokenization_spaces: ``transformers``' decoding clean-up (" ." -> ".",
            " 's" -> "'s", ...), as a ``tokenizer_config.json`` asks for it.
        chat_template: a ``ChatTemplate`` (or its config, or the text of a template, then
            rendered with this tokenizer's start / end / pad tokens), or None; used by
            ``apply_chat_template`` and ``encode_chat`` (``zoo.tokenizers.chat``).

    ``HFTokenizer.from_directory(path)`` reads a Hugging Face folder; ``save_to_directory``
    writes one that ``transformers.AutoTokenizer.from_pretrained`` loads.
    """

    def __init__(
        self,
        tokenizer_json,
        start_token=None,
        end_token=None,
        pad_token=None,
        stop_tokens=None,
        add_special_tokens=True,
        clean_up_tokenization_spaces=False,
        chat_template=None,
    ):
        if not isinstance(tokenizer_json, str):
            raise TypeError(f"tokenizer_json is the text of a tokenizer.json, got a {type(tokenizer_json).__name__}")
        self.tokenizer_json = tokenizer_json
        self.start_token = start_token
        self.end_token = end_token
        self.pad_token = pad_token
        self.stop_tokens = None if stop_tokens is None else list(stop_tokens)
        self.add_special_tokens = bool(add_special_tokens)
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.library = _library().Tokenizer.from_str(tokenizer_json)
        self.library.no_padding()
        self.library.no_truncation()
        self.vocabulary_size = self.library.get_vocab_size(with_added_tokens=True)
        self.start_token_id = self._special_id("start_token", start_token)
        self.end_token_id = self._special_id("end_token", end_token)
        self.pad_token_id = self._special_id("pad_token", pad_token)
        stops = [self.end_token_id] + [self._special_id("stop_tokens", token) for token in self.stop_tokens or ()]
        self.stop_token_ids = tuple(dict.fromkeys(i for i in stops if i is not None))
        self.chat_template = _chat_template(chat_template, self)

    @classmethod
    def from_directory(cls, path, **overrides):
        """The tokenizer of a Hugging Face folder.

        Reads ``tokenizer.json`` (required), ``tokenizer_config.json`` (``bos_token``,
        ``eos_token``, ``pad_token``: strings or ``{"content": ...}``; ``add_bos_token`` /
        ``add_eos_token``, which rebuild the post-processor as ``transformers``' Llama and
        Gemma tokenizers do, except in a ``PreTrainedTokenizerFast`` config, where
        ``transformers`` ignores them; ``clean_up_tokenization_spaces``) and ``generation_config.json``
        (``eos_token_id``, an id or a list: the stop tokens), each if present. A token
        ``tokenizer_config.json`` lacks is taken from ``generation_config.json``'s
        ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id``. ``overrides`` go to the
        constructor (``add_special_tokens=False``, say). The chat template, when the folder
        has one: ``ChatTemplate.from_directory`` (``chat_template.jinja`` or the config's
        ``"chat_template"``, with the config's special tokens).
        """
        path = os.fspath(path)
        file = os.path.join(path, TOKENIZER_FILE)
        if not os.path.lexists(file):
            raise ValueError(f"no {TOKENIZER_FILE} in {path!r}: HFTokenizer.from_directory needs {file!r}")
        regular_file(file, what=f"a {TOKENIZER_FILE}")
        with open(file, encoding="utf-8") as f:
            try:
                tokenizer_json = f.read()
            except UnicodeDecodeError as error:
                raise ValueError(f"{file} is not UTF-8 text: {error}") from None
        config, generation = _read_json(path, CONFIG_FILE), _read_json(path, GENERATION_FILE)
        try:
            library = _library().Tokenizer.from_str(tokenizer_json)
        except Exception as error:  # noqa: BLE001 (the tokenizers library raises a bare Exception)
            raise ValueError(f"{file} is not a tokenizer the tokenizers library reads: {error}") from None
        eos_ids = _id_list(generation.get("eos_token_id"))
        padding = library.padding or {}
        tokens = {
            "start_token": _token_text(config.get("bos_token")) or _token_of(library, generation.get("bos_token_id")),
            "end_token": _token_text(config.get("eos_token")) or _token_of(library, eos_ids[0] if eos_ids else None),
            "pad_token": _token_text(config.get("pad_token"))
            or _token_of(library, generation.get("pad_token_id"))
            or padding.get("pad_token"),
        }
        if config.get("tokenizer_class") != "PreTrainedTokenizerFast" and (
            {"add_bos_token", "add_eos_token"} & set(config)
        ):
            # transformers' defaults when one flag is missing: add_bos_token=True, add_eos_token=False
            tokenizer_json = _with_template(
                library, tokens, config.get("add_bos_token", True), config.get("add_eos_token", False)
            )
        stop_tokens = [_token_of(library, i) for i in eos_ids]
        arguments = dict(
            tokens,
            stop_tokens=[token for token in stop_tokens if token != tokens["end_token"]]
            or None,  # besides the end token
            clean_up_tokenization_spaces=config.get("clean_up_tokenization_spaces", False),
            chat_template=ChatTemplate.from_directory(path, required=False),
        )
        return cls(tokenizer_json, **{**arguments, **overrides})

    def save_to_directory(self, path):
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (``transformers``'
        ``PreTrainedTokenizerFast``, whose encodings then hold ``input_ids`` and
        ``attention_mask``, what a causal LM takes); with stop tokens besides the end token, also
        ``generation_config.json``'s ``eos_token_id`` (a list; other keys of an existing
        file are kept). A chat template goes under ``"chat_template"`` (every transformers
        version reads it there), with those of its special tokens the config lacks."""
        path = os.fspath(path)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, TOKENIZER_FILE), "w", encoding="utf-8") as f:
            f.write(self.tokenizer_json)
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "model_input_names": MODEL_INPUTS,
        }
        for key, token in (
            ("bos_token", self.start_token),
            ("eos_token", self.end_token),
            ("pad_token", self.pad_token),
        ):
            if token is not None:
                config[key] = token
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template.template
            for key, token in self.chat_template.special_tokens.items():
                config.setdefault(key, token)
        _write_json(path, CONFIG_FILE, config)
        if set(self.stop_token_ids) - {self.end_token_id}:
            _write_json(
                path, GENERATION_FILE, {**_read_json(path, GENERATION_FILE), "eos_token_id": list(self.stop_token_ids)}
            )

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **variables):
        """``messages`` (``[{"role": ..., "content": ...}, ...]``) through the chat template:
        the text (``tokenize=False``) or int32 ids ``(L,)``, as ``transformers``'
        ``apply_chat_template`` gives them (``zoo.tokenizers.chat``)."""
        return chat.apply_chat_template(self, messages, add_generation_prompt, tokenize, **variables)

    def encode_chat(self, messages, add_generation_prompt=False, **variables):
        """``(token_ids, loss_mask)``, int32 ``(L,)``: 1 on the assistant turns' tokens."""
        return chat.encode_chat(self, messages, add_generation_prompt, **variables)

    def token_to_id(self, token):
        token_id = self.library.token_to_id(token)
        if token_id is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return token_id

    def id_to_token(self, token_id):
        return self.library.id_to_token(self._check_id(token_id))

    def get_config(self):
        return {
            "tokenizer_json": self.tokenizer_json,
            "start_token": self.start_token,
            "end_token": self.end_token,
            "pad_token": self.pad_token,
            "stop_tokens": self.stop_tokens,
            "add_special_tokens": self.add_special_tokens,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "chat_template": None if self.chat_template is None else self.chat_template.get_config(),
        }

    def _encode_one(self, text):
        return np.asarray(self.library.encode(text, add_special_tokens=self.add_special_tokens).ids, np.int32)

    def _encode_many(self, texts):
        encodings = self.library.encode_batch(texts, add_special_tokens=self.add_special_tokens)
        return [np.asarray(encoding.ids, np.int32) for encoding in encodings]

    def _decode_one(self, ids):
        specials = [i for i in (self.start_token_id, self.end_token_id) if i is not None]
        text = self.library.decode(ids[~np.isin(ids, specials)].tolist(), skip_special_tokens=True)
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    def _special_id(self, argument, token):
        if token is None:
            return None
        token_id = self.library.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{argument}: token {token!r} is not in the vocabulary")
        return token_id


def _chat_template(value, tokenizer):
    """The ``chat_template`` argument as a ``ChatTemplate`` (or None)."""
    if value is None or isinstance(value, ChatTemplate):
        return value
    if isinstance(value, dict):
        return ChatTemplate.from_config(value)
    if isinstance(value, str):
        return ChatTemplate(value, special_tokens=chat.default_special_tokens(tokenizer))
    raise TypeError(
        f"chat_template must be a ChatTemplate, its config, the text of a template or None, got a {type(value).__name__}"
    )


def _library():
    try:
        import tokenizers
    except ImportError as error:
        raise ImportError('HFTokenizer needs the `tokenizers` library: pip install "keras-zoo[hf]"') from error
    return tokenizers


def _read_json(path, name):
    """The JSON object in ``path/name``, or {} when there is no such file; ``ValueError``
    naming it when it is a special file, not JSON or not an object."""
    file = os.path.join(path, name)
    if not os.path.lexists(file):
        return {}
    value = read_json_file(file, max_bytes=MAX_TOKENIZER_JSON_BYTES)
    if not isinstance(value, dict):
        raise ValueError(f"{file} holds a JSON {type(value).__name__}, not an object of keys")
    return value


def _write_json(path, name, value):
    with open(os.path.join(path, name), "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _token_text(value):
    """A special token in ``tokenizer_config.json``: a string, ``{"content": ...}`` or null."""
    return value.get("content") if isinstance(value, dict) else value


def _id_list(value):
    """``eos_token_id``: an id, a list of ids or null -> a list."""
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _token_of(library, token_id):
    if token_id is None:
        return None
    token = library.id_to_token(token_id)
    if token is None:
        raise ValueError(f"token id {token_id} (from {GENERATION_FILE}) is not in the vocabulary")
    return token


def _with_template(library, tokens, add_bos, add_eos):
    """The JSON text with the post-processor ``transformers``' ``LlamaTokenizerFast``
    builds from ``add_bos_token`` / ``add_eos_token`` (``update_post_processor``)."""
    bos, eos = tokens["start_token"], tokens["end_token"]
    for flag, token, name in ((add_bos, bos, "add_bos_token"), (add_eos, eos, "add_eos_token")):
        if flag and token is None:
            raise ValueError(f"{CONFIG_FILE}: {name} is true but the tokenizer has no such token")
    first = f"{bos}:0 " if add_bos else ""
    last = f" {eos}:0" if add_eos else ""
    single = f"{first}$A:0{last}"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1{f' {eos}:1' if add_eos else ''}"
    special = [(token, library.token_to_id(token)) for flag, token in ((add_bos, bos), (add_eos, eos)) if flag]
    library.post_processor = _library().processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    return library.to_str()


# transformers' clean_up_tokenization: (before, after), applied in this order.
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"))
_CLEAN_UP += ((" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _clean_up(text):
    """``transformers``' ``clean_up_tokenization`` (spaces before punctuation and contractions)."""
    for before, after in _CLEAN_UP:
        text = text.replace(before, after)
    return text
