"""All-gather KV attention: local queries against the whole, gathered K/V sequence.

The local step is ``local_attention`` (the tiled kernel, or cuDNN on a GPU where it
applies) on the gathered K/V; the all-gather's transpose reduce-scatters dK and dV.
"""

import jax
import jax.numpy as jnp

from zoo.kernels import _checks
from zoo.kernels._masking import segment_pair
from zoo.kernels.attention_seam import local_attention
from zoo.kernels.load_balance import permutation, shard_positions

__all__ = ["gather_kv_attention"]


def gather_kv_attention(
    q,
    k,
    v,
    *,
    axis_name,
    causal=False,
    key_mask=None,
    scale=None,
    balance=None,
    block_size=512,
    sliding_window=None,
    softcap=None,
    segment_ids=None,
):
    """Sequence-parallel attention by all-gathering K/V; call inside ``jax.shard_map``.

    Cheapest when K/V are small (few KV heads): each device receives (N-1)/N of K and V
    and holds the whole K/V sequence; scores are computed in tiles (``block_size``), so
    the score memory is f32[B, H, tile, tile], not [T/N, T]. On an axis of size 1 no
    collective is emitted.

    Shapes: global q [B, T, H, D], k/v [B, T, K, D], key_mask bool[B, T]; this function
    sees one shard: q [B, T/N, H, D], k/v [B, T/N, K, D], key_mask bool[B, T/N].

    Args:
        axis_name: mesh axis the sequence is split over (N = its size).
        causal: causal masking by global position.
        key_mask: optional key padding mask (this shard's part; True keeps), or None.
        scale: multiplies q.k; defaults to 1 / sqrt(D).
        balance: None, "zigzag" or "striped": how the sequence was laid out
            (``load_balance.reorder``); it sets the positions causality uses.
        block_size: tile edge of the local step (``blockwise_attention``).
        sliding_window: None, or W >= 1 with ``causal``: a query at position p sees keys
            at p - W < k <= p; the local step visits only the tiles windows touch.
            The all-gather still brings every K/V shard (see ``ring_attention`` for
            a kernel whose communication falls with the window).

        softcap: None, or c > 0: scores c * tanh(scores / c) before the mask (local step).
        segment_ids: i32[B, T/N] (this shard's part) document ids of packed rows (0 =
            padding), or None; the keys' ids are all-gathered with K/V (int32: 1/(2D) of
            K's bytes per KV head), the local queries keep theirs.

    Returns:
        [B, T/N, H, D] in q's dtype, this shard's rows of the attention output.
    """
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    n = jax.lax.axis_size(axis_name)
    q_len, kv_len = q.shape[1], k.shape[1]
    _checks.check_shard_lengths(q_len, kv_len, axis_size=n, axis_name=axis_name, balance=balance)

    # [B, T/N, K, D] -> [B, T, K, D] in shard order (the reordered order if balanced)
    k_all, v_all = (_gather(x, axis_name, n) for x in (k, v))
    mask_all = None if key_mask is None else _gather(key_mask, axis_name, n)
    segment_ids, _ = segment_pair(segment_ids, None, q_shape=q.shape, k_shape=k.shape)  # i32[B, T/N] or None
    kv_segment_ids = None if segment_ids is None else _gather(segment_ids, axis_name, n)  # i32[B, T]
    q_positions = k_positions = None  # natural order, unless the shards say otherwise
    if n > 1:
        me = jax.lax.axis_index(axis_name)
        q_positions = shard_positions(q_len, shard_index=me, num_shards=n, balance=balance)
        if balance is not None:
            k_positions = jnp.asarray(permutation(kv_len * n, num_shards=n, balance=balance))
    return local_attention(
        q,
        k_all,
        v_all,
        causal=causal,
        key_mask=mask_all,
        scale=scale,
        q_positions=q_positions,
        k_positions=k_positions,
        block_size=block_size,
        sliding_window=window,
        softcap=softcap,
        segment_ids=segment_ids,
        kv_segment_ids=kv_segment_ids,
    )


def _gather(x, axis_name, n):
    """[B, T/N, ...] -> [B, T, ...] along ``axis_name``; on one device, x itself (no collective)."""
    return x if n == 1 else jax.lax.all_gather(x, axis_name, axis=1, tiled=True)
