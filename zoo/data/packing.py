"""Packing: several examples per row, each told apart by ``segment_ids``.

One example a row (a prompt and its completion, a conversation) pads every row to T; a
short example wastes most of its row. ``pack_examples`` places whole examples into rows
of the same T, best-fit decreasing (longest first, each into the row it fills best, as
TRL's ``packing_strategy="bfd"``), and numbers them within each row: ``segment_ids`` 1, 2, ... (0 = padding). The model
attends within a segment only (``GPTBackbone`` on ``{"token_ids", "segment_ids"}``), so a
packed row computes what each of its examples computes alone; each example keeps its own
labels and loss weights, so no label crosses into the next example. An example's length
is up to its last label in the loss (what follows it changes nothing that is counted).

Plain text (documents already packed into windows): ``text_files.pack_texts(...,
segments=True)``. ``padding_fraction`` says how much of the rows is padding, before and
after.
"""

import bisect

import numpy as np

from zoo.data.text_files import LMExamples


def example_lengths(examples):
    """int (N,): the tokens of each row up to and including its last label in the loss
    (0 for a row with none); a packed row's real tokens (its segments)."""
    if examples.segment_ids is not None:
        return (examples.segment_ids > 0).sum(axis=1)
    counted = examples.sample_weight > 0  # (N, T)
    last = examples.sequence_length - np.argmax(counted[:, ::-1], axis=1)  # one past the last counted label
    return np.where(counted.any(axis=1), last, 0)


def padding_fraction(examples):
    """The share of the N x T token slots that hold no example's token."""
    slots = len(examples) * examples.sequence_length
    return 1.0 - float(example_lengths(examples).sum()) / slots if slots else 0.0


def pack_examples(examples):
    """``LMExamples`` with ``segment_ids``: ``examples`` (one a row, not packed) placed into
    as few rows of the same T as best-fit decreasing finds (module doc)."""
    if examples.segment_ids is not None:
        raise ValueError("these examples are packed already (they have segment_ids)")
    lengths = example_lengths(examples)  # (N,)
    rows = _best_fit_decreasing(lengths, examples.sequence_length)  # [[example index, ...] per row]
    shape = (len(rows), examples.sequence_length)
    token_ids, labels = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    sample_weight, segment_ids = np.zeros(shape, np.float32), np.zeros(shape, np.int32)
    for row, members in enumerate(rows):
        start = 0
        for segment, index in enumerate(members, start=1):
            end = start + lengths[index]
            token_ids[row, start:end] = examples.token_ids[index, : lengths[index]]
            labels[row, start:end] = examples.labels[index, : lengths[index]]
            sample_weight[row, start:end] = examples.sample_weight[index, : lengths[index]]
            segment_ids[row, start:end] = segment
            start = end
    return LMExamples(token_ids, labels, sample_weight, segment_ids)


def _best_fit_decreasing(lengths, capacity):
    """Rows of example indices: longest first, each into the open row with the least room
    that still fits it, else a new row (rows in the order opened, a row's examples in the
    order placed). Examples of length 0 are left out. O(N log N) but for the list inserts."""
    rows, open_rows = [], []  # open_rows: sorted (room left, row)
    for index in sorted(np.flatnonzero(lengths), key=lambda index: (-lengths[index], index)):
        length = int(lengths[index])
        place = bisect.bisect_left(open_rows, (length, -1))
        if place == len(open_rows):
            rows.append([])
            room, row = capacity, len(rows) - 1
        else:
            room, row = open_rows.pop(place)
        rows[row].append(int(index))
        if room - length:
            bisect.insort(open_rows, (room - length, row))
    return rows
