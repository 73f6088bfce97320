"""Single-device scaled dot-product attention: the reference every parallel kernel matches.

It materialises the [B, H, T, S] scores. In the attention seam's registry (``REFERENCE``) it
runs a cached decoding step whose scores are no bigger than one tile of the tiled kernel
(T x S <= 512 x 512, e.g. one new token over a cache of 8,192): there the tiles' loops and
custom VJP buy nothing and cost compile time.
"""

import jax
import jax.numpy as jnp

from zoo.kernels import _checks
from zoo.kernels._attention_spec import LocalKernel
from zoo.kernels._masking import apply_mask, attention_mask, default_positions, segment_pair
from zoo.kernels._online_softmax import F32, block_scores, group_heads

__all__ = ["REFERENCE", "attention_reference"]

ONE_TILE = 512 * 512  # scores: the tiled kernel's default tile, T x S


def attention_reference(
    q,
    k,
    v,
    *,
    causal=False,
    key_mask=None,
    scale=None,
    q_positions=None,
    k_positions=None,
    sliding_window=None,
    softcap=None,
    segment_ids=None,
    kv_segment_ids=None,
):
    """Softmax attention over the whole sequence on one device.

    Shapes (this function sees whole arrays; inside ``shard_map`` they are one shard's):
        q: [B, T, H, D] queries.
        k, v: [B, S, K, D] keys and values; K (num_kv_heads) divides H. Query head h
            uses KV head h // (H / K) (GQA; K = 1 is MQA), like ``repeat(k, H/K, axis=2)``.
        key_mask: bool[B, S] or None; True keeps the key (padding = False).
        q_positions: i32[T] or i32[B, T]; global position of each query. Defaults to
            0..T-1. Sharded kernels pass the positions their (possibly reordered) tokens
            hold, so causality follows positions, not array order.
        k_positions: i32[S] or i32[B, S]; the same for keys.
        segment_ids: i32[B, T] or None; document id of each query in a packed row
            (0 = padding, 1, 2, ... documents): a query sees only keys of its own
            document, and no query sees a key of id 0 (with ``key_mask``, both apply).
        kv_segment_ids: i32[B, S] or None; the keys' ids, when they are not the
            queries' (None: ``segment_ids``, which needs S = T).

    Args:
        causal: a query at position p attends keys at positions <= p.
        scale: multiplies q.k; defaults to 1 / sqrt(D).
        sliding_window: None, or W >= 1 with ``causal``: a query at position p attends
            keys at positions p - W < k <= p (W keys, itself included; Mistral's window).
        softcap: None, or c > 0: scores become c * tanh(scale * q.k / c) before the mask
            (Gemma 2's ``attn_logit_softcapping``).

    Returns:
        [B, T, H, D] in q's dtype. Scores, softmax and the weighted sum are float32 for
        any input dtype. A query that can see no key (all masked) gets 0, not NaN.
    """
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    sliding_window = _checks.check_sliding_window(sliding_window, causal=causal)
    softcap = _checks.check_softcap(softcap)
    batch, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    q_positions = default_positions(q_len) if q_positions is None else q_positions
    k_positions = default_positions(kv_len) if k_positions is None else k_positions
    q_segments, k_segments = segment_pair(segment_ids, kv_segment_ids, q_shape=q.shape, k_shape=k.shape)

    # f32[B, K, G, T, S], masked entries -inf
    mask = attention_mask(
        q_positions=q_positions,
        k_positions=k_positions,
        key_mask=key_mask,
        causal=causal,
        sliding_window=sliding_window,
        q_segments=q_segments,
        k_segments=k_segments,
    )
    scores = apply_mask(block_scores(group_heads(q, num_kv_heads), k, scale=scale, softcap=softcap), mask)
    probs = _softmax_or_zero(scores)
    # f32[B, T, K, G, D] -> [B, T, H, D]
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(F32))
    return out.reshape(batch, q_len, num_heads, head_dim).astype(q.dtype)


def _softmax_or_zero(scores):
    """Softmax over the last axis; a row of all -inf gives all zeros (not NaN)."""
    row_max = jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True))
    row_max = jnp.where(jnp.isneginf(row_max), 0.0, row_max)
    weights = jnp.exp(scores - row_max)
    total = weights.sum(axis=-1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def _supports(query):
    return query.inference and query.q_len is not None and query.q_len * query.kv_len <= ONE_TILE


def _run(q, k, v, spec, **arrays):  # arrays: key_mask, q_positions, k_positions, segment_ids, kv_segment_ids
    options = {name: value for name, value in spec.options().items() if name != "block_size"}  # no tiles
    return attention_reference(q, k, v, **arrays, **options)


REFERENCE = LocalKernel("reference", _supports, _run, lambda query, block_size: "reference (scores materialised)")
