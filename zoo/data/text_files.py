"""Text for fine-tuning a causal language model: local JSONL or plain-text files, or the
text of a language-modelling dataset, as ``LMExamples`` (token ids, labels, loss weights).

File formats (UTF-8):

- JSONL, one JSON object a line (blank lines skipped), every line of one kind:
  ``{"prompt": ..., "completion": ...}``: one example a line, the loss on the completion
  only (``preprocessor(prompts, completions)`` gives 0 weight to the prompt's labels); or
  ``{"text": ...}``: documents, packed (below). Other keys are ignored.
- Anything else (``.txt``, ``.md``, ...): plain text, one document, packed.

Packing: each document is tokenized as ``[start] text [end]`` (the tokens the tokenizer
has), the documents are concatenated, and the stream is cut into windows of ``T + 1``
tokens that overlap by one (``token_ids`` the first ``T``, ``labels`` the last ``T``), so
every token but the first is a label once; the last window is right-padded with weight 0.

This module takes the preprocessor as an argument (``zoo.models.gpt.GPTCausalLMPreprocessor``
or anything with ``__call__(prompts, completions)``, ``tokenizer`` and ``sequence_length``):
``zoo.data`` sits below the models and imports none.
"""

import dataclasses
import json
import math
import os

import numpy as np

from zoo.data import catalog, tfds_source
from zoo.data._windows import next_token_windows
from zoo.file_kinds import regular_file

JSONL_SUFFIXES = (".jsonl", ".ndjson")  # read as JSONL; any other file is plain text
PROMPT_KEYS = ("prompt", "completion")
TEXT_KEY = "text"


@dataclasses.dataclass(frozen=True)
class LMExamples:
    """``N`` examples of length ``T``, as ``model.fit(token_ids, labels, sample_weight=...)`` takes them.

    token_ids: int32 (N, T). labels: int32 (N, T), the next token of each position.
    sample_weight: float32 (N, T), 1 where the label counts in the loss (completion and
    end tokens; every real token of packed text), 0 on prompts and padding.
    segment_ids: int32 (N, T) or None: packed rows (``zoo.data.packing``), the document of
    each token in its row (1, 2, ...; 0 = padding); attention stays within a document.
    dropped: what the loader left out or cut to make these rows, one phrase per reason with
    its count and the setting that keeps them (``"left out 32 of 64 conversations: ..."``);
    kept by row selection, so ``zoo finetune`` can say it in one line at the start.
    """

    token_ids: np.ndarray
    labels: np.ndarray
    sample_weight: np.ndarray
    segment_ids: np.ndarray | None = None
    dropped: tuple = ()

    def __len__(self):
        return len(self.token_ids)

    def __getitem__(self, rows):
        """The examples at ``rows`` (a slice, or an index array): another ``LMExamples``."""
        if isinstance(rows, (int, np.integer)):
            rows = slice(rows, rows + 1)
        segments = None if self.segment_ids is None else self.segment_ids[rows]
        return LMExamples(self.token_ids[rows], self.labels[rows], self.sample_weight[rows], segments, self.dropped)

    @property
    def sequence_length(self):
        return self.token_ids.shape[1]

    @property
    def loss_tokens(self):
        """How many labels count in the loss."""
        return int(self.sample_weight.sum())

    def arrays(self):
        """``(token_ids, labels, sample_weight)``."""
        return self.token_ids, self.labels, self.sample_weight

    def inputs(self):
        """What the model takes: token_ids (N, T), or for packed rows
        ``{"token_ids": (N, T), "segment_ids": (N, T)}``."""
        if self.segment_ids is None:
            return self.token_ids
        return {"token_ids": self.token_ids, "segment_ids": self.segment_ids}

    def padded_to(self, multiple):
        """These examples and ``(-N) mod multiple`` rows of padding (weight 0), so that
        every batch of ``multiple`` rows is full (one compiled shape for evaluation)."""
        extra = -len(self) % multiple
        if extra == 0:
            return self
        pad = lambda array: (
            None if array is None else np.concatenate([array, np.zeros((extra, *array.shape[1:]), array.dtype)])
        )  # noqa: E731
        return LMExamples(pad(self.token_ids), pad(self.labels), pad(self.sample_weight), pad(self.segment_ids))


# --- files ---------------------------------------------------------------------------


def load_text_file(path, preprocessor, *, segments=False):
    """``LMExamples`` of a JSONL or plain-text file (see the module doc), each row of
    ``preprocessor.sequence_length`` tokens. Rows with no label in the loss (a prompt that
    fills the whole sequence) are left out. ``segments``: packed documents keep apart
    (``pack_texts``). Raises ``ValueError`` naming the file, and the line and key for JSONL."""
    path = os.fspath(path)
    if path.lower().endswith(JSONL_SUFFIXES):
        kind, columns = read_jsonl(path)
        if kind == TEXT_KEY:
            return pack_texts(columns[0], preprocessor, segments=segments)
        return _with_loss(preprocessor(*columns), path, end_token_id=preprocessor.tokenizer.end_token_id)
    return pack_texts([read_text(path)], preprocessor, segments=segments)


def read_text(path):
    """A whole UTF-8 file as one string; an error naming the file when it is missing,
    not UTF-8, or holds only white space."""
    raw = _read_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {raw[error.start : error.start + 1]!r} at offset {error.start})"
        ) from None
    if not text.strip():
        raise ValueError(f"{path}: the file is empty" if not text else f"{path}: the file holds only white space")
    return text


def read_jsonl(path):
    """``("prompt", (prompts, completions))`` or ``("text", (texts,))`` from a JSONL file.

    Every non-blank line is a JSON object with string values under ``"prompt"`` and
    ``"completion"``, or under ``"text"``; the first line sets the kind for the file.
    Errors name the file, the line number and the key.
    """
    kind, rows = None, []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        record = _json_object(path, number, line)
        kind = kind or (TEXT_KEY if TEXT_KEY in record and not set(PROMPT_KEYS) & set(record) else "prompt")
        keys = (TEXT_KEY,) if kind == TEXT_KEY else PROMPT_KEYS
        rows.append(tuple(_string(path, number, record, key, kind) for key in keys))
    return kind, tuple(list(column) for column in zip(*rows))


def _read_bytes(path):
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a folder; give a .jsonl or text file")
    try:
        regular_file(path, what="a .jsonl or text file")  # a FIFO would block, /dev/zero never end
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot be read: {error.strerror or error}") from None


def _json_object(path, number, line):
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} line {number}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(
            f"{path} line {number}: expected a JSON object such as {_example()}, got {type(record).__name__} {_short(line)}"
        )
    return record


def _string(path, number, record, key, kind):
    if key not in record:
        hint = (
            f'the file\'s lines hold {{"{TEXT_KEY}": ...}}'
            if kind == TEXT_KEY
            else f"the file's lines hold {_example()}"
        )
        raise ValueError(
            f"{path} line {number}: missing key {key!r} ({hint}; the first line sets the kind); it has {sorted(record)}"
        )
    value = record[key]
    if not isinstance(value, str):
        raise ValueError(
            f"{path} line {number}: {key!r} must be a string, got {type(value).__name__} {_short(json.dumps(value))}"
        )
    return value


def _example():
    return '{"prompt": "...", "completion": "..."}'


def _short(text, limit=60):
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _with_loss(arrays, where, end_token_id=None):
    """``LMExamples`` of the preprocessor's arrays, without rows that have no label in the
    loss; ``dropped`` counts them, and the rows cut before their end (``end_token_id`` not
    among their labels in the loss; with no end token, a completion reaching the row's end)."""
    examples = LMExamples(*(np.asarray(array) for array in arrays))
    keep = examples.sample_weight.sum(axis=1) > 0
    if not keep.any():
        raise ValueError(
            f"{where}: no example has a completion token within sequence length {examples.sequence_length}; raise --sequence-length"
        )
    length, dropped = examples.sequence_length, []
    if not keep.all():
        dropped.append(
            f"left out {np.count_nonzero(~keep)} of {len(keep)} examples (no completion token within sequence length "
            f"{length}; a larger --sequence-length keeps them)"
        )
    if end_token_id is not None:  # a row whose end token is in the loss ended within it
        ended = ((examples.labels == end_token_id) & (examples.sample_weight > 0)).any(axis=1)
    else:  # no end token (bytes): a row whose completion runs to its last position was cut (or just fits)
        ended = examples.sample_weight[:, -1] == 0
    cut = np.count_nonzero(keep & ~ended)
    if cut:
        dropped.append(
            f"cut {cut} of {len(keep)} examples at sequence length {length}, losing their end"
            f"{' token' if end_token_id is not None else ''} (a larger --sequence-length keeps them whole)"
        )
    examples = dataclasses.replace(examples, dropped=tuple(dropped))
    return examples if keep.all() else examples[np.flatnonzero(keep)]


# --- packing -------------------------------------------------------------------------


def pack_texts(texts, preprocessor, *, segments=False):
    """Documents packed into windows of ``preprocessor.sequence_length`` (module doc).
    ``segments``: each window also says which document each token is from
    (``segment_ids``, 1, 2, ... per window), so attention stays within a document, and a
    label from the next document (a document's last token predicting the next one's
    first) is out of the loss."""
    tokenizer, length = preprocessor.tokenizer, preprocessor.sequence_length
    documents = [document_ids(tokenizer, text) for text in texts]
    ids = np.concatenate(documents)  # (L,)
    examples = pack_ids(ids, length, pad_id=tokenizer.pad_token_id or 0)
    if not segments:
        return examples
    document = np.repeat(np.arange(1, len(documents) + 1), [len(ids) for ids in documents])  # (L,) 1..n
    return _with_document_ids(examples, document)


def _with_document_ids(examples, document):
    """``examples`` (windows of one stream, ``pack_ids``) with per-window ``segment_ids``
    from ``document`` (L,), the stream's document of each token, and no label across a
    document boundary."""
    count, length = examples.token_ids.shape
    stream = np.zeros(count * length + 1, np.int64)  # (N T + 1,): 0 past the stream's end
    stream[: len(document)] = document
    token_document = stream[:-1].reshape(count, length)  # (N, T)
    label_document = stream[1:].reshape(count, length)  # (N, T)
    first = token_document[:, :1]  # (N, 1): the window's first document
    segment_ids = np.where(token_document > 0, token_document - first + 1, 0).astype(np.int32)
    weight = examples.sample_weight * (token_document == label_document)
    return LMExamples(examples.token_ids, examples.labels, weight.astype(np.float32), segment_ids)


def document_ids(tokenizer, text):
    """int32 ``[start] + text's ids + [end]``, once each (a start or end token the
    tokenizer adds itself is kept, not doubled)."""
    ids = list(np.asarray(tokenizer.encode(text), np.int32))
    start, end = tokenizer.start_token_id, tokenizer.end_token_id
    if start is not None and ids[:1] != [start]:
        ids.insert(0, start)
    if end is not None and ids[-1:] != [end]:
        ids.append(end)
    return np.asarray(ids, np.int32)


def pack_ids(ids, sequence_length, pad_id=0):
    """``LMExamples`` of one token stream ``(L,)``: windows of ``T + 1`` overlapping by one;
    the last is padded with ``pad_id`` at weight 0. Needs ``L >= 2``."""
    ids = np.asarray(ids, np.int32)
    if len(ids) < 2:
        raise ValueError(f"packing needs at least 2 tokens (one to predict from, one to predict), got {len(ids)}")
    count = math.ceil((len(ids) - 1) / sequence_length)  # N windows
    padded = np.full(count * sequence_length + 1, pad_id, np.int32)  # (N T + 1,)
    padded[: len(ids)] = ids
    token_ids, labels = next_token_windows(padded, sequence_length)  # (N, T) each
    label_index = np.arange(count)[:, None] * sequence_length + np.arange(1, sequence_length + 1)[None, :]  # (N, T)
    return LMExamples(token_ids, labels, (label_index < len(ids)).astype(np.float32))


# --- held-out split and datasets -------------------------------------------------------


def split_held_out(examples, fraction):
    """``(train, held_out)``: the last ``ceil(fraction * N)`` examples held out (none when
    ``fraction`` is 0). Raises when either part would be empty."""
    if not 0 <= fraction < 1:
        raise ValueError(f"the held-out fraction must be in [0, 1), got {fraction}")
    held = math.ceil(fraction * len(examples))
    if held and held >= len(examples):
        raise ValueError(
            f"{len(examples)} example(s) cannot be split {1 - fraction:.0%}/{fraction:.0%} with both parts non-empty; give more data or a validation file"
        )
    return examples[: len(examples) - held], examples[len(examples) - held :]


def dataset_text(name, split, data_dir=None):
    """The whole text of a language-modelling dataset's split (``zoo data list``), as
    ``zoo.data.load`` reads it before cutting it into byte windows: python_docs' topics
    joined by blank lines, other corpora (tiny_shakespeare) concatenated."""
    spec = catalog.get_spec(name)
    if spec.task != catalog.LANGUAGE_MODELING:
        corpora = [other.name for other in catalog.DATASETS.values() if other.task == catalog.LANGUAGE_MODELING]
        raise ValueError(
            f"dataset {name!r} is {spec.task} data; a causal LM fine-tunes on {catalog.LANGUAGE_MODELING} data: {', '.join(corpora)}"
        )
    if split not in spec.splits:
        raise ValueError(f"dataset {name!r} has no split {split!r}; its splits are {list(spec.splits)}")
    source = tfds_source.read_split(spec.builder, split, data_dir=data_dir)
    if spec.name.startswith("python_docs"):
        topics, texts = tfds_source.to_numpy(source, ["topic", "text"])
        return "\n\n".join(dict(sorted(zip(topics, texts))).values())
    (texts,) = tfds_source.to_numpy(source, ["text"])
    return "".join(texts)
