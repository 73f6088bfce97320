"""The tile loops of every attention kernel: all local queries against one K/V block.

``blockwise_attention`` runs them once over the whole K/V; ``ring_attention`` once per
ring step over the K/V shard held then (gather and Ulysses call ``blockwise_attention``
on their gathered K/V). ``start_forward``/``finish_forward`` and ``start_backward``
are the set-up and finish both share.

Both passes walk (query block x key block) tiles with ``lax.fori_loop``, so the largest
score array alive is f32[B, K, G, bq, bk], never the shard's full [T/N, T/N]. Under
causal attention each tile is guarded by ``lax.cond``: a tile in which no query may see
any key (max query position < min key position) runs the identity branch and costs
nothing. With a sliding window W the loops do not even visit such tiles: each query
tile walks only the key tiles ``_blocking.tile_work`` keeps (and each key tile, in the
backward pass, only those query tiles), listed from the positions by
``_blocking.listed_tiles``, so the steps are O(T x W / tile^2), not O(T^2 / tile^2).
Padding masks and document segment ids are applied inside tiles, never skipped (they are
data; a tile skipped by positions is hidden whatever its segments say).

Letters: B batch, Tq/Tk local query/key length, bq/bk tile sizes, K KV heads, G query
heads per KV head, D head dim.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from zoo.kernels._blocking import block_has_work, listed_tiles, tile_work
from zoo.kernels._masking import apply_mask, attention_mask
from zoo.kernels._online_softmax import (
    F32,
    SoftmaxState,
    block_scores,
    finish,
    group_heads,
    init_state,
    softcap_grad,
    ungroup_heads,
    update,
)


class TileConfig(NamedTuple):
    """Static settings of the tiled loops."""

    causal: bool
    scale: float
    block_q: int
    block_k: int
    window: object = None  # None, or the sliding window W (an int; implies causal)
    softcap: object = None  # None, or c: scores c * tanh(scores / c) before the mask (Gemma 2)


def start_forward(q, kv_heads):
    """Grouped queries [B, Tq, K, G, D], an empty softmax state over them, tile count 0."""
    batch, q_len, _, head_dim = q.shape
    qg = group_heads(q, kv_heads)  # [B, Tq, K, G, D]
    state = init_state(qg, batch=batch, kv_heads=kv_heads, groups=qg.shape[3], length=q_len, head_dim=head_dim)
    return qg, state, jnp.zeros_like(q, shape=(), dtype=jnp.int32)


def finish_forward(state, dtype):
    """(out [B, Tq, H, D] in ``dtype``, lse f32[B, K, G, Tq]) from the final state."""
    out, lse = finish(state)  # f32[B, K, G, Tq, D], f32[B, K, G, Tq]
    return ungroup_heads(out).astype(dtype), lse


def start_backward(q, out, d_out, kv_heads):
    """(qg, d_out grouped, delta f32[B, K, G, Tq], dq f32[B, Tq, K, G, D] zeros).

    delta = rowsum(d_out * out), the offset of the softmax backward.
    """
    qg, dog = group_heads(q, kv_heads), group_heads(d_out, kv_heads)  # [B, Tq, K, G, D]
    delta = jnp.sum(dog.astype(F32) * group_heads(out, kv_heads).astype(F32), axis=-1)  # f32[B, Tq, K, G]
    return qg, dog, delta.transpose(0, 2, 3, 1), jnp.zeros_like(qg, dtype=F32)


def _tile(x, index, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, index * size, size, axis=axis)


def _put(x, tile, index, size, axis):
    return jax.lax.dynamic_update_slice_in_dim(x, tile, index * size, axis=axis)


def _tile_mask(key_mask, index, size):
    """The tile of a [B, L] key mask (or segment ids) along L, or None."""
    return None if key_mask is None else _tile(key_mask, index, size, axis=1)


def _if_visible(cfg, listed, q_pos, k_pos, compute, carry):
    """Runs ``compute(carry)`` unless causality hides the whole tile (then returns carry).

    A listed walk (``listed`` not None) visits only tiles with work: no test needed.
    """
    if not cfg.causal or listed is not None:
        return compute(carry)
    return jax.lax.cond(block_has_work(q_pos, k_pos), compute, lambda c: c, carry)


def _listed(cfg, q_pos, k_pos, *, by_keys=False):
    """None (walk every tile), or with a window (count, columns) per query tile (per key tile).

    Computed from the positions at run time (they may be traced: ``axis_index``, the ring
    step), so every device and ring step lists its own tiles.
    """
    if cfg.window is None:
        return None
    # bool[Tq/bq, Tk/bk]
    work = tile_work(
        q_pos, k_pos, block_q=cfg.block_q, block_k=cfg.block_k, causal=cfg.causal, sliding_window=cfg.window
    )
    return listed_tiles(work.T if by_keys else work)


def _inner_loop(listed, outer, length, step, carry):
    """``step(j, carry)`` over the inner tiles j of outer tile ``outer``: all ``length``, or the listed ones."""
    if listed is None:
        return jax.lax.fori_loop(0, length, step, carry)
    counts, columns = listed  # i32[R], i32[R, C]
    return jax.lax.fori_loop(0, counts[outer], lambda t, c: step(columns[outer, t], c), carry)


def _masked_scores(cfg, q_blk, k_blk, q_pos, k_pos, key_mask, segments=(None, None)):
    # f32[B, K, G, bq, bk], hidden pairs -inf; segments: (i32[B, bq], i32[B, bk]) or (None, None)
    mask = attention_mask(
        q_positions=q_pos,
        k_positions=k_pos,
        key_mask=key_mask,
        causal=cfg.causal,
        sliding_window=cfg.window,
        q_segments=segments[0],
        k_segments=segments[1],
    )
    return apply_mask(block_scores(q_blk, k_blk, scale=cfg.scale, softcap=cfg.softcap), mask)


def forward_shard(q, k, v, key_mask, q_pos, k_pos, state, count, cfg, q_segments=None, k_segments=None):
    """Folds one K/V shard into the running softmax state of all local queries.

    Args:
        q: [B, Tq, K, G, D] local queries, grouped by KV head.
        k, v: [B, Tk, K, D] the K/V shard held at this ring step.
        key_mask: bool[B, Tk] or None, travelling with k/v.
        q_pos, k_pos: i32[Tq], i32[Tk] global positions.
        state: SoftmaxState over all Tq local queries.
        count: i32 scalar, tiles computed so far (for the load-balance test).
        q_segments, k_segments: i32[B, Tq] (the local queries') and i32[B, Tk] (travelling
            with k/v) document ids, or both None (``_masking.segment_mask``). Tiles are
            skipped by positions only: segments only hide more pairs, inside the tile.
    Returns:
        (state, count) updated.
    """
    bq, bk = cfg.block_q, cfg.block_k
    listed = _listed(cfg, q_pos, k_pos)  # None, or the key tiles each query tile visits

    def q_step(i, carry):
        state, count = carry
        q_blk, qp = _tile(q, i, bq, 1), _tile(q_pos, i, bq, 0)  # [B, bq, K, G, D]
        q_seg = _tile_mask(q_segments, i, bq)  # i32[B, bq] or None
        stats = SoftmaxState(*(_tile(x, i, bq, 3) for x in state))  # f32[B, K, G, bq(, D)]

        def k_step(j, carry):
            kp = _tile(k_pos, j, bk, 0)

            def compute(carry):
                stats, count = carry
                segments = (q_seg, _tile_mask(k_segments, j, bk))  # i32[B, bq], i32[B, bk] or None
                scores = _masked_scores(cfg, q_blk, _tile(k, j, bk, 1), qp, kp, _tile_mask(key_mask, j, bk), segments)
                return update(stats, scores, _tile(v, j, bk, 1)), count + 1

            return _if_visible(cfg, listed, qp, kp, compute, carry)

        stats, count = _inner_loop(listed, i, k.shape[1] // bk, k_step, (stats, count))
        state = SoftmaxState(*(_put(x, s, i, bq, 3) for x, s in zip(state, stats)))
        return state, count

    return jax.lax.fori_loop(0, q.shape[1] // bq, q_step, (state, count))


def _tile_grads(cfg, q_blk, do_blk, lse_blk, delta_blk, k_blk, v_blk, scores):
    """Flash-attention backward for one tile; returns (dq, dk, dv) contributions, f32."""
    q_blk, do_blk = q_blk.astype(F32), do_blk.astype(F32)  # [B, bq, K, G, D]
    k_blk, v_blk = k_blk.astype(F32), v_blk.astype(F32)  # [B, bk, K, D]
    p = jnp.exp(scores - lse_blk[..., None])  # f32[B, K, G, bq, bk], recomputed probs
    dv = jnp.einsum("bkgts,btkgd->bskd", p, do_blk)
    dp = jnp.einsum("btkgd,bskd->bkgts", do_blk, v_blk)
    ds = softcap_grad(p * (dp - delta_blk[..., None]), scores, cfg.softcap) * cfg.scale  # d(loss)/d(q.k)
    dq = jnp.einsum("bkgts,bskd->btkgd", ds, k_blk)
    dk = jnp.einsum("bkgts,btkgd->bskd", ds, q_blk)
    return dq, dk, dv


def backward_shard(q, d_out, lse, delta, k, v, key_mask, q_pos, k_pos, grads, cfg, q_segments=None, k_segments=None):
    """Adds this K/V shard's share to dq, and the local queries' share to its dk, dv.

    Args:
        q, d_out: [B, Tq, K, G, D] local queries and output cotangent.
        lse, delta: f32[B, K, G, Tq]; log-sum-exp saved by the forward pass, and
            rowsum(d_out * out).
        k, v, key_mask, q_pos, k_pos, q_segments, k_segments: as in ``forward_shard``.
        grads: (dq f32[B, Tq, K, G, D], dk f32[B, Tk, K, D], dv f32[B, Tk, K, D]); dk and
            dv belong to the K/V shard held now and travel around the ring with it.
    Returns:
        (dq, dk, dv) updated.
    """
    bq, bk = cfg.block_q, cfg.block_k
    listed = _listed(cfg, q_pos, k_pos, by_keys=True)  # None, or the query tiles each key tile visits

    def k_step(j, grads):
        dq, dk, dv = grads
        k_blk, v_blk, kp = _tile(k, j, bk, 1), _tile(v, j, bk, 1), _tile(k_pos, j, bk, 0)
        km, k_seg = _tile_mask(key_mask, j, bk), _tile_mask(k_segments, j, bk)  # bool/i32[B, bk] or None

        def q_step(i, carry):
            qp = _tile(q_pos, i, bq, 0)

            def compute(carry):
                dq, dk_blk, dv_blk = carry
                q_blk = _tile(q, i, bq, 1)
                segments = (_tile_mask(q_segments, i, bq), k_seg)  # i32[B, bq], i32[B, bk] or None
                scores = _masked_scores(cfg, q_blk, k_blk, qp, kp, km, segments)
                dq_t, dk_t, dv_t = _tile_grads(
                    cfg,
                    q_blk,
                    _tile(d_out, i, bq, 1),
                    _tile(lse, i, bq, 3),
                    _tile(delta, i, bq, 3),
                    k_blk,
                    v_blk,
                    scores,
                )
                dq = _put(dq, _tile(dq, i, bq, 1) + dq_t, i, bq, 1)
                return dq, dk_blk + dk_t, dv_blk + dv_t

            return _if_visible(cfg, listed, qp, kp, compute, carry)

        carry = (dq, _tile(dk, j, bk, 1), _tile(dv, j, bk, 1))
        dq, dk_blk, dv_blk = _inner_loop(listed, j, q.shape[1] // bq, q_step, carry)
        return dq, _put(dk, dk_blk, j, bk, 1), _put(dv, dv_blk, j, bk, 1)

    return jax.lax.fori_loop(0, k.shape[1] // bk, k_step, grads)
