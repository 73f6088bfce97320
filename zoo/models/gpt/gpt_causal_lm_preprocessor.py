"""``GPTCausalLMPreprocessor``: text -> (token ids, labels, sample weights) for ``GPTCausalLM``.

keras-hub's ``CausalLMPreprocessor`` shape, in plain NumPy (no tf.data). Training:

    text  --tokenizer-->  ids  --pack-->  [start] ids [end] pad ...   (N, T + 1), cut to T + 1
    token_ids = packed[:, :-1]   labels = packed[:, 1:]   sample_weight = 1 on real labels

Generation: ``generate_preprocess`` left-pads the prompts (with a padding mask);
``generate_postprocess`` decodes what the model returns, up to the first stop token.
"""

import keras
import numpy as np

from zoo.tokenizers import Tokenizer


@keras.saving.register_keras_serializable(package="zoo")
class GPTCausalLMPreprocessor:
    """Packs text for a causal language model (keras-hub's ``CausalLMPreprocessor``).

    ``preprocessor(texts)`` -> ``(token_ids, labels, sample_weight)``, int32 / int32 /
    float32 ``(N, T)`` with ``T = sequence_length``, which ``model.fit`` takes as
    ``x, y, sample_weight``. Each text is tokenized (a start or end token the tokenizer's
    post-processor adds is removed first, so none is doubled), packed as
    ``[start] + ids + [end]``, cut to ``T + 1`` tokens (a cut text has no end token) and
    right-padded with ``pad_token_id`` (0 when the tokenizer has none); ``token_ids`` is
    the packed row without its last token, ``labels`` without its first, and
    ``sample_weight`` is 1 where the label is a real token, 0 on padding.

    ``preprocessor(prompts, completions)`` packs ``[start] + prompt + completion + [end]``
    (each tokenized on its own) and also gives 0 weight to every label that is a prompt
    token: the loss covers the completion and the end token only.

    Args:
        tokenizer: a ``zoo.tokenizers.Tokenizer`` without a ``sequence_length`` of its own.
        sequence_length: T, the length of ``token_ids`` and ``labels``.
        add_start_token: put the tokenizer's start token first (when it has one).
        add_end_token: put its end token after the text (when it has one).
    """

    def __init__(self, tokenizer, sequence_length, add_start_token=True, add_end_token=True):
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be a zoo.tokenizers.Tokenizer, got a {type(tokenizer).__name__}")
        if tokenizer.sequence_length is not None:
            raise ValueError(
                f"the tokenizer pads to its own sequence_length={tokenizer.sequence_length}; the preprocessor packs "
                f"to sequence_length={sequence_length}: give it a tokenizer built without one"
            )
        if (
            isinstance(sequence_length, bool)
            or not isinstance(sequence_length, (int, np.integer))
            or sequence_length < 1
        ):
            raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}")
        self.tokenizer = tokenizer
        self.sequence_length = int(sequence_length)
        self.add_start_token = bool(add_start_token)
        self.add_end_token = bool(add_end_token)

    def __call__(self, texts, completions=None):
        """``(token_ids, labels, sample_weight)``, each ``(N, sequence_length)``; see the class."""
        texts = _text_list(texts, "texts")
        if completions is None:
            rows = [self._start() + self._content(text) + self._end() for text in texts]
            prompt_sizes = [0] * len(rows)
        else:
            completions = _text_list(completions, "completions")
            if len(completions) != len(texts):
                raise ValueError(f"{len(texts)} prompts but {len(completions)} completions")
            prompts = [self._start() + self._content(prompt) for prompt in texts]
            rows = [
                prompt + self._content(completion) + self._end() for prompt, completion in zip(prompts, completions)
            ]
            prompt_sizes = [len(prompt) for prompt in prompts]
        packed, lengths = self._right_padded(rows, self.sequence_length + 1)  # (N, T + 1)
        label_positions = np.arange(1, self.sequence_length + 1)[None, :]  # (1, T): column of packed each label is
        real = label_positions < lengths[:, None]
        completion = label_positions >= np.asarray(prompt_sizes, np.int64)[:, None]
        return packed[:, :-1], packed[:, 1:], (real & completion).astype(np.float32)

    def generate_preprocess(self, prompts):
        """``(token_ids int32 (B, P), padding_mask bool (B, P))``: ``[start] + prompt``,
        left-padded to the longest (P); the mask is True on real tokens. No end token."""
        rows = [self._start() + self._content(prompt) for prompt in _text_list(prompts, "prompts")]
        width = max(len(row) for row in rows)
        token_ids = np.full((len(rows), width), self._padding_id(), np.int32)
        padding_mask = np.zeros((len(rows), width), bool)
        for index, row in enumerate(rows):
            token_ids[index, width - len(row) :] = row
            padding_mask[index, width - len(row) :] = True
        return token_ids, padding_mask

    def generate_postprocess(self, token_ids, prompt_lengths=None):
        """Decode generated rows ``(B, L)`` to ``B`` strings, prompt and continuation.

        Each row is cut before the first stop token (``tokenizer.stop_token_ids``) after
        its prompt, then decoded with special tokens and padding skipped.

        Args:
            token_ids: what generation returns, ``(B, L)`` (or one row ``(L,)``, giving one
                string): the left-padded prompts (``generate_preprocess``) and the new tokens.
            prompt_lengths: where the new tokens begin: an int (the prompts' padded width P)
                or one per row ``(B,)``. None: after the left padding and the start token
                (then a stop token inside a prompt would end it early).
        """
        token_ids = np.asarray(token_ids)
        if token_ids.ndim == 1:
            return self.generate_postprocess(token_ids[None, :], prompt_lengths)[0]
        if token_ids.ndim != 2:
            raise ValueError(f"token_ids must be (B, L), got shape {token_ids.shape}")
        starts = self._generation_starts(token_ids, prompt_lengths)  # (B,)
        texts = []
        for row, start in zip(token_ids, starts):
            stops = np.flatnonzero(np.isin(row[start:], self.tokenizer.stop_token_ids))
            end = start + stops[0] if stops.size else len(row)
            texts.append(self.tokenizer.decode(row[_leading_padding(row[:end], self._padding_id()) : end]))
        return texts

    def get_config(self):
        return {
            "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
            "sequence_length": self.sequence_length,
            "add_start_token": self.add_start_token,
            "add_end_token": self.add_end_token,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config["tokenizer"], dict):
            config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        return cls(**config)

    def _content(self, text):
        """The text's token ids as a list, without a start or end token the tokenizer added."""
        ids = self.tokenizer.encode(text).tolist()
        start, end = self.tokenizer.start_token_id, self.tokenizer.end_token_id
        if ids and start is not None and ids[0] == start:
            ids = ids[1:]
        if ids and end is not None and ids[-1] == end:
            ids = ids[:-1]
        return ids

    def _start(self):
        start = self.tokenizer.start_token_id
        return [start] if self.add_start_token and start is not None else []

    def _end(self):
        end = self.tokenizer.end_token_id
        return [end] if self.add_end_token and end is not None else []

    def _padding_id(self):
        pad = self.tokenizer.pad_token_id
        return 0 if pad is None else pad

    def _right_padded(self, rows, width):
        """``(int32 (N, width), int64 (N,) real lengths)``: rows cut to ``width``, then padded."""
        packed = np.full((len(rows), width), self._padding_id(), np.int32)
        lengths = np.zeros(len(rows), np.int64)
        for index, row in enumerate(rows):
            row = row[:width]
            packed[index, : len(row)] = row
            lengths[index] = len(row)
        return packed, lengths

    def _generation_starts(self, token_ids, prompt_lengths):
        batch = token_ids.shape[0]
        if prompt_lengths is not None:
            starts = np.broadcast_to(np.asarray(prompt_lengths, np.int64), (batch,))
            if starts.min() < 0 or starts.max() > token_ids.shape[1]:
                raise ValueError(f"prompt_lengths must be in [0, {token_ids.shape[1]}], got {prompt_lengths!r}")
            return starts
        starts = np.array([_leading_padding(row, self._padding_id()) for row in token_ids], np.int64)
        start_id = self.tokenizer.start_token_id
        if start_id is not None:
            starts += [start < len(row) and row[start] == start_id for row, start in zip(token_ids, starts)]
        return starts


def _text_list(texts, name):
    """A string or a sequence of strings -> a non-empty list of strings."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError(f"{name} is empty")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be strings; item {index} is a {type(text).__name__}")
    return texts


def _leading_padding(row, padding_id):
    """How many of the row's first ids are padding (left padding)."""
    real = np.flatnonzero(row != padding_id)
    return int(real[0]) if real.size else len(row)
