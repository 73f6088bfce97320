"""All-gather KV attention: local queries against the whole, gathered K/V sequence."""

import jax
import jax.numpy as jnp

from zoo.kernels import _checks
from zoo.kernels.attention_reference import attention_reference
from zoo.kernels.load_balance import permutation, shard_positions

__all__ = ["gather_kv_attention"]


def gather_kv_attention(q, k, v, *, axis_name, causal=False, key_mask=None, scale=None, balance=None):
    """Sequence-parallel attention by all-gathering K/V; call inside ``jax.shard_map``.

    Cheapest when K/V are small (few KV heads): each device receives (N-1)/N of K and V,
    and holds f32[B, H, T/N, T] scores, so memory grows with the full length T.

    Shapes: global q [B, T, H, D], k/v [B, T, K, D], key_mask bool[B, T]; this function
    sees one shard: q [B, T/N, H, D], k/v [B, T/N, K, D], key_mask bool[B, T/N].

    Args:
        axis_name: mesh axis the sequence is split over (N = its size).
        causal: causal masking by global position.
        key_mask: optional key padding mask (this shard's part; True keeps), or None.
        scale: multiplies q.k; defaults to 1 / sqrt(D).
        balance: None, "zigzag" or "striped": how the sequence was laid out
            (``load_balance.reorder``); it sets the positions causality uses.

    Returns:
        [B, T/N, H, D] in q's dtype, this shard's rows of the attention output.
    """
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    n = jax.lax.axis_size(axis_name)
    q_len, kv_len = q.shape[1], k.shape[1]
    _checks.check_shard_lengths(q_len, kv_len, axis_size=n, axis_name=axis_name, balance=balance)

    # [B, T/N, K, D] -> [B, T, K, D] in shard order (the reordered order if balanced)
    k_all, v_all = (jax.lax.all_gather(x, axis_name, axis=1, tiled=True) for x in (k, v))
    mask_all = None if key_mask is None else jax.lax.all_gather(key_mask, axis_name, axis=1, tiled=True)
    me = jax.lax.axis_index(axis_name)
    q_positions = shard_positions(q_len, shard_index=me, num_shards=n, balance=balance)
    k_positions = jnp.asarray(permutation(kv_len * n, num_shards=n, balance=balance))
    return attention_reference(
        q, k_all, v_all, causal=causal, key_mask=mask_all, scale=scale,
        q_positions=q_positions, k_positions=k_positions,
    )
