"""Cutting token streams into fixed-length windows."""

import numpy as np


def next_token_windows(ids, sequence_length):
    """Non-overlapping LM windows: ``x, y`` int32 ``(N, T)``, ``y`` is ``x`` shifted by one token.

    The tail shorter than ``T + 1`` tokens is dropped.
    """
    count = (len(ids) - 1) // sequence_length
    starts = np.arange(count) * sequence_length  # (N,)
    window = starts[:, None] + np.arange(sequence_length)[None, :]  # (N, T)
    return ids[window], ids[window + 1]


def chunk_windows(ids, sequence_length):
    """Non-overlapping windows ``(N, T)`` of ``ids``; the tail shorter than ``T`` is dropped."""
    count = len(ids) // sequence_length
    return ids[: count * sequence_length].reshape(count, sequence_length)


def check_sequence_length(sequence_length):
    if not isinstance(sequence_length, int) or sequence_length < 1:
        raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}")
