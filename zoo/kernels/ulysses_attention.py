"""Ulysses attention: trade the sequence split for a head split with two all-to-alls."""

import jax
import jax.numpy as jnp

from zoo.kernels import _checks
from zoo.kernels._masking import segment_pair
from zoo.kernels.attention_seam import local_attention
from zoo.kernels.load_balance import permutation

__all__ = ["ulysses_attention"]


def ulysses_attention(
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
    """Sequence-parallel attention by re-sharding heads; call inside ``jax.shard_map``.

    An all-to-all turns the sequence-sharded q, k, v into head-sharded ones, each device
    runs ordinary attention over the whole sequence for H/N heads, and a second
    all-to-all turns the output back. Each device sends and receives (N-1)/N of its
    shard per tensor. The local step is ``local_attention`` (tiled, or cuDNN on a GPU
    where it applies), so memory is O(T x tile) for H/N heads. On an axis of size 1 no
    collective is emitted.

    KV heads: K must divide H. If K is not a multiple of N (e.g. K=2 KV heads on N=8
    devices, or MQA), K/V heads are first repeated to lcm(K, N) heads, which still
    divides H, so every device gets the KV heads its query heads use.

    Shapes: global q [B, T, H, D], k/v [B, T, K, D], key_mask bool[B, T]; this function
    sees one shard: q [B, T/N, H, D], k/v [B, T/N, K, D], key_mask bool[B, T/N].

    Args:
        axis_name: mesh axis the sequence is split over (N = its size); H must be
            divisible by N.
        causal: causal masking by global position.
        key_mask: optional key padding mask (this shard's part; True keeps), or None.
        scale: multiplies q.k; defaults to 1 / sqrt(D).
        balance: None, "zigzag" or "striped": how the sequence was laid out
            (``load_balance.reorder``); it sets the positions causality uses.
        block_size: tile edge of the local step (``blockwise_attention``).
        sliding_window: None, or W >= 1 with ``causal``: a query at position p sees keys
            at p - W < k <= p; the local step visits only the tiles windows touch.
            The all-to-alls are unchanged: every device needs all T tokens of its heads.

        softcap: None, or c > 0: scores c * tanh(scores / c) before the mask (local step).
        segment_ids: i32[B, T/N] (this shard's part) document ids of packed rows (0 =
            padding), or None. After the all-to-all each device attends over the whole
            sequence for its heads, so the ids are all-gathered (int32 [B, T], small) and
            serve as its queries' and keys' ids alike.

    Returns:
        [B, T/N, H, D] in q's dtype, this shard's rows of the attention output.
    """
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    n = jax.lax.axis_size(axis_name)
    num_heads, num_kv_heads = q.shape[2], k.shape[2]
    _checks.check_heads_divisible(num_heads, axis_size=n, axis_name=axis_name)
    _checks.check_shard_lengths(q.shape[1], k.shape[1], axis_size=n, axis_name=axis_name, balance=balance)
    repeats = _checks.ulysses_kv_heads(num_kv_heads, n) // num_kv_heads
    k, v = (jnp.repeat(x, repeats, axis=2) for x in (k, v))  # [B, T/N, lcm(K, N), D]

    # [B, T/N, H, D] -> [B, T, H/N, D]: scatter heads, gather sequence (in shard order)
    q_h, k_h, v_h = (_seq_to_heads(x, axis_name, n) for x in (q, k, v))
    mask = key_mask
    if key_mask is not None and n > 1:
        mask = jax.lax.all_gather(key_mask, axis_name, axis=1, tiled=True)  # bool[B, T]
    segment_ids, _ = segment_pair(segment_ids, None, q_shape=q.shape, k_shape=q.shape)  # i32[B, T/N] or None
    if segment_ids is not None and n > 1:
        segment_ids = jax.lax.all_gather(segment_ids, axis_name, axis=1, tiled=True)  # i32[B, T], shard order
    positions = None  # natural order unless balanced over N > 1 shards
    if balance is not None and n > 1:
        positions = jnp.asarray(permutation(q_h.shape[1], num_shards=n, balance=balance))
    out = local_attention(
        q_h,
        k_h,
        v_h,
        causal=causal,
        key_mask=mask,
        scale=scale,
        q_positions=positions,
        k_positions=positions,
        block_size=block_size,
        sliding_window=window,
        softcap=softcap,
        segment_ids=segment_ids,
    )
    # [B, T, H/N, D] -> [B, T/N, H, D]
    return out if n == 1 else jax.lax.all_to_all(out, axis_name, split_axis=1, concat_axis=2, tiled=True)


def _seq_to_heads(x, axis_name, n):
    """[B, T/N, H, D] -> [B, T, H/N, D]; on one device, x itself (no collective)."""
    return x if n == 1 else jax.lax.all_to_all(x, axis_name, split_axis=2, concat_axis=1, tiled=True)
