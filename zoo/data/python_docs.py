"""An English text corpus every CPython carries: the ``pydoc`` topic help.

``pydoc_data.topics`` holds the language reference sections that ``help("if")`` shows:
about 465k characters in 79 topics on Python 3.11 (the text differs slightly between
Python versions). Two tasks are built from it:

- language modelling (``python_docs``): next-byte prediction on windows of the text;
- text classification (``python_docs_topics``): which part of the language reference
  a window comes from: statements, expressions, the data model / built-in types, or
  the execution model.

Each topic's text is split by position, first 90% train, next 5% validation, last 5%
test, so no split sees another's sentences.
"""

import numpy as np

from zoo.data._windows import check_sequence_length, chunk_windows, next_token_windows
from zoo.tokenizers import ByteTokenizer

SPLIT_FRACTIONS = {"train": (0.0, 0.9), "validation": (0.9, 0.95), "test": (0.95, 1.0)}

# Topic -> class for the classification task. Topics a Python version lacks are skipped;
# topics it adds (not listed here) are used for language modelling only.
TOPIC_GROUPS = {
    "statements": (
        "assert assignment augassign async break class compound continue del else for function "
        "global if import nonlocal pass raise return try while with yield"
    ).split(),
    "expressions": (
        "atom-identifiers atom-literals attribute-references await binary bitwise booleans calls "
        "comparisons conversions dict exprlists floating formatstrings id-classes identifiers "
        "imaginary in integers lambda lists numbers operator-summary power shifting slicings "
        "strings subscriptions unary"
    ).split(),
    "data model": (
        "attribute-access bltin-code-objects bltin-ellipsis-object bltin-null-object "
        "bltin-type-objects callable-types context-managers customization numeric-types objects "
        "sequence-types specialattrs specialnames string-methods truth types typesfunctions "
        "typesmapping typesmethods typesmodules typesseq typesseq-mutable"
    ).split(),
    "execution model": "debugger dynamic-features exceptions execmodel naming".split(),
}
TOPIC_CLASSES = tuple(TOPIC_GROUPS)


def python_docs_topics():
    """``{topic: text}`` from this Python's ``pydoc_data``, sorted by topic."""
    from pydoc_data.topics import topics

    return {name: topics[name] for name in sorted(topics)}


def python_docs_text(split="train"):
    """The ``split`` part of every topic, joined by blank lines."""
    return "\n\n".join(_split_part(text, split) for text in python_docs_topics().values())


def _split_part(text, split):
    if split not in SPLIT_FRACTIONS:
        raise ValueError(f"unknown split {split!r}; choose one of {list(SPLIT_FRACTIONS)}")
    start, stop = SPLIT_FRACTIONS[split]
    return text[int(start * len(text)) : int(stop * len(text))]


def load_python_docs_lm(split="train", sequence_length=128):
    """Next-byte windows: ``x, y`` int32 ``(N, T)`` with ``y[:, t] = x[:, t + 1]`` in the text.

    Windows do not overlap; the tail shorter than ``T + 1`` bytes is dropped.
    """
    check_sequence_length(sequence_length)
    return next_token_windows(ByteTokenizer().encode(python_docs_text(split)), sequence_length)


def load_python_docs_topics(split="train", sequence_length=256):
    """Topic-class windows: ``x`` int32 ``(N, T)`` byte ids, ``y`` int32 ``(N,)`` in ``TOPIC_CLASSES``."""
    check_sequence_length(sequence_length)
    topics = python_docs_topics()
    texts = {name: _split_part(text, split) for name, text in topics.items()}
    return topic_windows(texts, sequence_length)


def topic_group(topic):
    """The class index of ``topic`` in ``TOPIC_CLASSES``, or None when it is in no group."""
    return next((index for index, names in enumerate(TOPIC_GROUPS.values()) if topic in names), None)


def topic_windows(texts, sequence_length):
    """``{topic: text}`` -> windows ``x`` int32 ``(N, T)`` and their group labels ``y`` ``(N,)``."""
    tokenizer = ByteTokenizer()
    xs, ys = [], []
    for name, text in texts.items():
        label = topic_group(name)
        if label is None:
            continue
        windows = chunk_windows(tokenizer.encode(text), sequence_length)
        xs.append(windows)
        ys.append(np.full(len(windows), label, np.int32))
    return np.concatenate(xs), np.concatenate(ys)


def unigram_entropy(ids):
    """Entropy in nats of the byte distribution of ``ids``: the loss of a model that ignores context."""
    counts = np.bincount(np.asarray(ids).ravel(), minlength=ByteTokenizer.vocabulary_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
