"""Which (query, key) pairs may attend: causality (and a sliding window) from positions, plus key padding.

Scores are laid out f32[B, K, G, T, S] (batch, KV heads, query heads per KV head,
queries, keys), so a mask is bool[B|1, 1, 1, T, S].
"""

import jax.numpy as jnp


def default_positions(length):
    """Positions 0..length-1 of a sequence in its natural order: i32[length]."""
    return jnp.arange(length, dtype=jnp.int32)


def attention_mask(*, q_positions, k_positions, key_mask=None, causal=False, sliding_window=None):
    """Boolean mask (True = attend) of shape [B|1, 1, 1, T, S], or None if nothing is masked.

    Args:
        q_positions: i32[T] or i32[B, T], global position of each query.
        k_positions: i32[S] or i32[B, S], global position of each key.
        key_mask: bool[B, S] or None; True keeps the key.
        causal: if True a query at position p sees keys at positions <= p.
        sliding_window: None or W >= 1 (with ``causal``, checked by
            ``_checks.check_sliding_window``): a query at p sees keys at p - W < k <= p.
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
    return mask


def apply_mask(scores, mask):
    """Masked scores become -inf, so exp() gives exactly 0 and gradients stay finite."""
    if mask is None:
        return scores
    return jnp.where(mask, scores, -jnp.inf)
