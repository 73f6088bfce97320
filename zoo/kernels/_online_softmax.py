"""Blockwise softmax attention in float32: scores, running (max, sum, acc) update, finish.

Letters: B batch, T queries, S keys, K KV heads, G query heads per KV head (H = K*G),
D head dim. Queries are grouped as [B, T, K, G, D] so GQA/MQA never copies K/V.

Masked scores are -inf. The running max of a row that has seen no visible key is -inf;
it is replaced by 0 before subtracting, so exp() gives 0 (never inf - inf = NaN), and a
row that never sees a key finishes with sum 0 and output 0.
"""

from typing import NamedTuple

import jax.numpy as jnp

F32 = jnp.float32


class SoftmaxState(NamedTuple):
    """Running statistics for a block of queries."""

    m: object  # f32[B, K, G, T] running max of the scores
    l: object  # f32[B, K, G, T] running sum of exp(score - m)  # noqa: E741 (the flash-attention name)
    acc: object  # f32[B, K, G, T, D] running sum of exp(score - m) * v


def group_heads(q, num_kv_heads):
    """[B, T, H, D] -> [B, T, K, G, D]; query head h uses KV head h // G."""
    b, t, h, d = q.shape
    return q.reshape(b, t, num_kv_heads, h // num_kv_heads, d)


def block_scores(q, k, *, scale, softcap=None):
    """f32[B, K, G, T, S] = scale * q.k, with q [B, T, K, G, D] and k [B, S, K, D]; with
    ``softcap`` c, c * tanh(scale * q.k / c) (Gemma 2's attention-logit soft-capping,
    applied before the mask)."""
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=F32) * scale
    return scores if softcap is None else softcap * jnp.tanh(scores / softcap)


def softcap_grad(ds, scores, softcap):
    """d(loss)/d(scale * q.k) from d(loss)/d(capped scores) ``ds``: times 1 - tanh^2, with
    tanh = capped / c; masked scores (-inf, where ``ds`` is 0) count as 0."""
    if softcap is None:
        return ds
    t = jnp.where(jnp.isneginf(scores), 0.0, scores / softcap)  # f32[..., bq, bk], tanh(raw / c)
    return ds * (1.0 - t * t)


def init_state(like, *, batch, kv_heads, groups, length, head_dim):
    """Empty state (max -inf, sum 0, acc 0); ``like`` carries shard_map's varying-ness."""
    stats = (batch, kv_heads, groups, length)
    return SoftmaxState(
        m=jnp.full_like(like, -jnp.inf, shape=stats, dtype=F32),
        l=jnp.zeros_like(like, shape=stats, dtype=F32),
        acc=jnp.zeros_like(like, shape=stats + (head_dim,), dtype=F32),
    )


def _safe(m):
    """-inf (no visible key yet) -> 0, so exp(score - m) is exp(-inf) = 0, not NaN."""
    return jnp.where(jnp.isneginf(m), 0.0, m)


def update(state, scores, v):
    """Fold one block of masked scores f32[B, K, G, T, S] and values [B, S, K, D] in."""
    m_new = jnp.maximum(state.m, scores.max(axis=-1))  # f32[B, K, G, T]
    m_safe = _safe(m_new)
    correction = jnp.exp(state.m - m_safe)  # rescales what was summed under the old max
    p = jnp.exp(scores - m_safe[..., None])  # f32[B, K, G, T, S]
    l_new = state.l * correction + p.sum(axis=-1)
    pv = jnp.einsum("bkgts,bskd->bkgtd", p, v.astype(F32))  # f32[B, K, G, T, D]
    return SoftmaxState(m_new, l_new, state.acc * correction[..., None] + pv)


def finish(state):
    """Returns (out f32[B, K, G, T, D], lse f32[B, K, G, T]); empty rows give out 0, lse 0.

    ``lse`` is log(sum(exp(scores))), what the backward pass needs to recompute
    probabilities as exp(score - lse); for empty rows every score is -inf, so 0 is safe.
    """
    seen = state.l > 0
    out = state.acc / jnp.where(seen, state.l, 1.0)[..., None]
    lse = jnp.where(seen, state.m + jnp.log(jnp.where(seen, state.l, 1.0)), 0.0)
    return out, lse


def ungroup_heads(out):
    """f32[B, K, G, T, D] -> [B, T, H, D]."""
    b, k, g, t, d = out.shape
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, k * g, d)
