"""Which (query, key) pairs may attend: causality (and a sliding window) from positions,
key padding, and document segments (packing).

Scores are laid out f32[B, K, G, T, S] (batch, KV heads, query heads per KV head,
queries, keys), so a mask is bool[B|1, 1, 1, T, S].

Segments: a packed row holds several documents; ``q_segments`` i32[B, T] and
``k_segments`` i32[B, S] say which document each token belongs to (0 = padding, no
document; 1, 2, ... documents). A query sees a key only of its own document, and a key
of segment 0 is seen by no query (a padding query, segment 0, sees nothing: output 0).
Causality and windows still compare global positions: within one document they order
the tokens as the document's own positions would, and the segment test removes every
pair that crosses a boundary.
"""

import jax.numpy as jnp

from zoo.kernels import _checks


def default_positions(length):
    """Positions 0..length-1 of a sequence in its natural order: i32[length]."""
    return jnp.arange(length, dtype=jnp.int32)


def attention_mask(
    *, q_positions, k_positions, key_mask=None, causal=False, sliding_window=None, q_segments=None, k_segments=None
):
    """Boolean mask (True = attend) of shape [B|1, 1, 1, T, S], or None if nothing is masked.

    Args:
        q_positions: i32[T] or i32[B, T], global position of each query.
        k_positions: i32[S] or i32[B, S], global position of each key.
        key_mask: bool[B, S] or None; True keeps the key.
        causal: if True a query at position p sees keys at positions <= p.
        sliding_window: None or W >= 1 (with ``causal``, checked by
            ``_checks.check_sliding_window``): a query at p sees keys at p - W < k <= p.
        q_segments, k_segments: i32[B, T] and i32[B, S] document ids, or both None; a
            query sees a key of the same id, never one of id 0. With ``key_mask`` both apply.
    """
    mask = None
    if causal:
        # bool[T, S] or bool[B, T, S]
        mask = q_positions[..., :, None] >= k_positions[..., None, :]
        if sliding_window is not None:
            mask = mask & (q_positions[..., :, None] - k_positions[..., None, :] < sliding_window)
        if mask.ndim == 2:
            mask = mask[None]
        mask = mask[:, None, None]  # bool[B|1, 1, 1, T, S]
    if key_mask is not None:
        keep = key_mask.astype(bool)[:, None, None, None, :]  # bool[B, 1, 1, 1, S]
        mask = keep if mask is None else mask & keep
    if q_segments is not None:
        same = segment_mask(q_segments, k_segments)  # bool[B, 1, 1, T, S]
        mask = same if mask is None else mask & same
    return mask


def segment_mask(q_segments, k_segments):
    """bool[B, 1, 1, T, S]: query and key in the same document, the key not padding (id 0)."""
    same = q_segments[:, :, None] == k_segments[:, None, :]  # bool[B, T, S]
    same = same & (k_segments != 0)[:, None, :]
    return same[:, None, None]


def segment_pair(segment_ids, kv_segment_ids, *, q_shape, k_shape):
    """(q_segments i32[B, T], k_segments i32[B, S]), checked, or (None, None) without ids.

    ``segment_ids`` are the queries' document ids, [B, T]; ``kv_segment_ids`` the keys',
    [B, S], or None: the queries' ids again (self-attention, S = T).
    """
    if segment_ids is None:
        if kv_segment_ids is not None:
            raise ValueError("kv_segment_ids needs segment_ids (the queries' document ids) too")
        return None, None
    (batch, q_len), kv_len = q_shape[:2], k_shape[1]
    _checks.check_segment_ids(segment_ids.shape, segment_ids.dtype, expected=(batch, q_len), what="(batch, q length)")
    if kv_segment_ids is None:
        if kv_len != q_len:
            raise ValueError(
                f"segment_ids shape {tuple(segment_ids.shape)} serve as the keys' ids too only when there are as "
                f"many keys as queries; got {kv_len} keys for {q_len} queries: pass kv_segment_ids (batch, {kv_len})"
            )
        kv_segment_ids = segment_ids
    _checks.check_segment_ids(
        kv_segment_ids.shape,
        kv_segment_ids.dtype,
        expected=(batch, kv_len),
        name="kv_segment_ids",
        what="(batch, kv length)",
    )
    return jnp.asarray(segment_ids, jnp.int32), jnp.asarray(kv_segment_ids, jnp.int32)


def apply_mask(scores, mask):
    """Masked scores become -inf, so exp() gives exactly 0 and gradients stay finite."""
    if mask is None:
        return scores
    return jnp.where(mask, scores, -jnp.inf)
