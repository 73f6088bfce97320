"""Blockwise (tiled, online-softmax) attention on one device: memory O(T x tile), never [T, S].

The same tile loops as the ring (``_ring_blocks``), run once over the whole K/V:
queries and keys are walked in tiles of at most ``block_size`` rows, each tile's scores
folded into a float32 running (max, sum, weighted values) per query. A custom VJP saves
only q, k, v, the key mask, the positions, the segment ids (packing), the output and the
log-sum-exp, and the backward pass recomputes each tile's probabilities as
exp(score - lse) (flash-attention style). Under causal masking tiles that no query may see are skipped; with a sliding
window W (``sliding_window=``) the loops visit only the tiles the window touches, so the
work is O(T x W), and ``blockwise_tiles`` says which tiles those are, in plain numpy.

``BLOCKWISE`` is its entry in the attention seam's registry (``zoo.kernels.attention_seam``):
the kernel that takes every platform, shape and option, chosen where no other does.

Letters: B batch, T queries, S keys, H query heads, K KV heads (K divides H), D head dim.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from zoo.config.choices import ATTENTION_OUT
from zoo.kernels import _checks
from zoo.kernels._attention_spec import LocalKernel
from zoo.kernels._blocking import tile_plan, tile_work
from zoo.kernels._masking import default_positions, segment_pair
from zoo.kernels._ring_blocks import (
    TileConfig,
    backward_shard,
    finish_forward,
    forward_shard,
    start_backward,
    start_forward,
)

__all__ = ["BLOCKWISE", "blockwise_attention", "blockwise_tiles"]


def blockwise_attention(
    q,
    k,
    v,
    *,
    causal=False,
    key_mask=None,
    scale=None,
    q_positions=None,
    k_positions=None,
    block_size=512,
    sliding_window=None,
    softcap=None,
    segment_ids=None,
    kv_segment_ids=None,
):
    """Softmax attention of q over k, v in tiles; same arguments and result as ``attention_reference``.

    Shapes:
        q: [B, T, H, D]; k, v: [B, S, K, D] with K dividing H (GQA/MQA never copy K/V).
        key_mask: bool[B, S] or None; True keeps the key.
        q_positions, k_positions: i32[T], i32[S] global positions (default 0..T-1 and
            0..S-1); causality follows positions, not array order.

    Args:
        causal: a query at position p sees keys at positions <= p.
        scale: multiplies q.k; defaults to 1 / sqrt(D).
        block_size: tile edge. Queries (keys) are walked in tiles of the largest divisor
            of T (S) that is <= block_size; a length with no divisor of at least half
            that is padded up instead (``_blocking.tile_plan``). The largest score array
            alive is f32[B, K, H/K, tile, tile].
        sliding_window: None, or W >= 1 with ``causal``: a query at position p sees keys
            at p - W < k <= p. Only the tiles the window touches are visited (about
            T/tile x (W/tile + 1) of them; ``blockwise_tiles`` lists them).
        softcap: None, or c > 0: each tile's scores become c * tanh(scores / c) before
            the mask (Gemma 2); the backward pass multiplies by 1 - tanh^2.
        segment_ids, kv_segment_ids: i32[B, T] document ids of the queries (0 = padding)
            and i32[B, S] of the keys (None: ``segment_ids``, S = T), or None: a query
            sees only keys of its own document (packing), inside each tile.

    Returns:
        [B, T, H, D] in q's dtype; float32 softmax inside; a query that sees no key gives 0.
    """
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    q_len, kv_len = q.shape[1], k.shape[1]
    q_positions = _positions(q_positions, q_len, "q_positions")
    k_positions = _positions(k_positions, kv_len, "k_positions")
    q_seg, k_seg = segment_pair(segment_ids, kv_segment_ids, q_shape=q.shape, k_shape=k.shape)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    q_tile, q_padded = tile_plan(q_len, int(block_size))
    k_tile, k_padded = tile_plan(kv_len, int(block_size))
    tiles = TileConfig(bool(causal), scale, q_tile, k_tile, window, _checks.check_softcap(softcap))
    if k_padded > kv_len:  # padding keys are hidden by the mask
        keep = jnp.broadcast_to(jnp.arange(k_padded) < kv_len, (k.shape[0], k_padded))  # bool[B, S']
        key_mask = keep if key_mask is None else keep & _pad(key_mask, k_padded)
        k, v, k_positions = _pad(k, k_padded), _pad(v, k_padded), _pad(k_positions, k_padded, axis=0)
    q, q_positions = _pad(q, q_padded), _pad(q_positions, q_padded, axis=0)
    segments = _padded_segments(q_seg, k_seg, q_padded, k_padded)  # (i32[B, T'], i32[B, S']) or (None, None)
    out = _blockwise(q, k, v, key_mask, q_positions, k_positions, segments, tiles)  # [B, T', H, D]
    return out[:, :q_len]


def _padded_segments(q_seg, k_seg, q_padded, k_padded):
    """The ids padded with 0 (padding: seen by no query, sees no key), or (None, None)."""
    if q_seg is None:
        return None, None
    return _pad(q_seg, q_padded), _pad(k_seg, k_padded)


def blockwise_tiles(
    q_len, kv_len=None, *, block_size=512, causal=False, sliding_window=None, q_positions=None, k_positions=None
):
    """bool[Tq/tq, S/tk]: the (query tile, key tile) score tiles ``blockwise_attention`` computes.

    Plain numpy, no compile: the kernel's own tile sizes, padding and skip test
    (``_blocking.tile_work``) on the same arguments (``kv_len`` defaults to ``q_len``;
    positions numpy i32[T] / i32[S] or None for 0..T-1). The kernel's tile count (its
    forward pass) is ``blockwise_tiles(...).sum()``; backward visits the same tiles.
    """
    kv_len = q_len if kv_len is None else kv_len
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    (q_tile, q_padded), (k_tile, k_padded) = tile_plan(q_len, int(block_size)), tile_plan(kv_len, int(block_size))
    q_pos = _numpy_positions(q_positions, q_len, q_padded)  # i32[T']
    k_pos = _numpy_positions(k_positions, kv_len, k_padded)  # i32[S']
    return tile_work(q_pos, k_pos, block_q=q_tile, block_k=k_tile, causal=bool(causal), sliding_window=window)


def _numpy_positions(positions, length, padded):
    """i32[padded]: the positions (0..length-1 if None), the last one repeated as ``_pad`` does."""
    positions = np.arange(length, dtype=np.int32) if positions is None else np.asarray(positions, np.int32)
    return np.pad(positions, (0, padded - length), mode="edge")


def _positions(positions, length, name):
    """i32[length]: the given positions, or 0..length-1; raises on any other shape."""
    if positions is None:
        return default_positions(length)
    if tuple(positions.shape) != (length,):
        raise ValueError(f"{name} shape {tuple(positions.shape)} must be (length,) = ({length},)")
    return jnp.asarray(positions, jnp.int32)


def _pad(x, length, axis=1):
    """Pads ``axis`` to ``length``: zeros (False), or the last value for positions (axis 0)."""
    extra = length - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    # Positions repeat the last one, so a padded query tile is skipped wherever the last real one is.
    return jnp.pad(x, widths, mode="edge" if axis == 0 else "constant")


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _blockwise(q, k, v, key_mask, q_pos, k_pos, segments, tiles):
    return _forward(q, k, v, key_mask, q_pos, k_pos, segments, tiles)[0]


def _forward(q, k, v, key_mask, q_pos, k_pos, segments, tiles):
    """(out [B, T, H, D], lse f32[B, K, G, T]) by one pass of the tile loops.

    segments: (i32[B, T], i32[B, S]) document ids of queries and keys, or (None, None)."""
    qg, state, count = start_forward(q, k.shape[2])  # [B, T, K, G, D], state over T queries
    state, _ = forward_shard(qg, k, v, key_mask, q_pos, k_pos, state, count, tiles, *segments)
    return finish_forward(state, q.dtype)


def _blockwise_fwd(q, k, v, key_mask, q_pos, k_pos, segments, tiles):
    out, lse = _forward(q, k, v, key_mask, q_pos, k_pos, segments, tiles)
    out, lse = checkpoint_name(out, ATTENTION_OUT), checkpoint_name(lse, ATTENTION_OUT)  # a remat policy may keep them
    return out, (q, k, v, key_mask, q_pos, k_pos, segments, out, lse)


def _blockwise_bwd(tiles, residuals, d_out):
    q, k, v, key_mask, q_pos, k_pos, segments, out, lse = residuals
    qg, dog, delta, dq = start_backward(q, out, d_out, k.shape[2])  # dq f32[B, T, K, G, D]
    dkv = (jnp.zeros_like(k, dtype=jnp.float32), jnp.zeros_like(v, dtype=jnp.float32))  # f32[B, S, K, D]
    dq, dk, dv = backward_shard(qg, dog, lse, delta, k, v, key_mask, q_pos, k_pos, (dq, *dkv), tiles, *segments)
    dq = dq.reshape(q.shape)  # f32[B, T, K, G, D] -> [B, T, H, D]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, (None, None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def _run(q, k, v, spec, **arrays):  # arrays: key_mask, q_positions, k_positions, segment_ids, kv_segment_ids
    return blockwise_attention(q, k, v, **arrays, **spec.options())


def _describe(query, block_size):
    q_tile, k_tile = (tile_plan(length, block_size)[0] for length in (query.q_len, query.kv_len))
    return f"blockwise (tile {q_tile})" if q_tile == k_tile else f"blockwise (tile {q_tile}x{k_tile})"


BLOCKWISE = LocalKernel("blockwise", lambda query: True, _run, _describe)  # every platform, shape and option
