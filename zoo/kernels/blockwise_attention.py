"""Blockwise (tiled, online-softmax) attention on one device: memory O(T x tile), never [T, S].

The same tile loops as the ring (``_ring_blocks``), run once over the whole K/V:
queries and keys are walked in tiles of at most ``block_size`` rows, each tile's scores
folded into a float32 running (max, sum, weighted values) per query. A custom VJP saves
only q, k, v, the key mask, the positions, the segment ids (packing), the output and the
log-sum-exp, and the backward pass recomputes each tile's probabilities as
exp(score - lse) (flash-attention style). Under causal masking tiles that no query may see are skipped; with a sliding
window W (``sliding_window=``) the loops visit only the tiles the window touches, so the
work is O(T x W), and ``blockwise_tiles`` says which tiles those are, in plain numpy.

``local_attention`` picks, per call, between this kernel and cuDNN's fused attention
(``jax.nn.dot_product_attention(implementation="cudnn")``) on a CUDA GPU;
``attention_implementation`` is that choice as a pure function, testable anywhere.

Letters: B batch, T queries, S keys, H query heads, K KV heads (K divides H), D head dim.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from zoo.config.choices import ATTENTION_OUT
from zoo.kernels import _checks, splash_attention
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

__all__ = [
    "attention_implementation",
    "blockwise_attention",
    "blockwise_tiles",
    "describe_local_attention",
    "local_attention",
]

# cuDNN's fused attention (flash attention) as jax.nn.dot_product_attention runs it:
# fp16/bf16 inputs, head dim a multiple of 8 and <= 128 (<= 256 from Hopper on; 128 is
# what every SM80+ GPU takes), padding only as sequence lengths (not a boolean mask).
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128
CUDNN_PLATFORMS = ("gpu", "cuda")
SPLASH_PLATFORMS = ("tpu",)  # splash attention: JAX's Pallas TPU kernel


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


def attention_implementation(
    *,
    platform,
    dtype,
    head_dim,
    causal=False,
    masked=False,
    natural_order=True,
    q_len=None,
    kv_len=None,
    softcapped=False,
    key_masked=None,
    segmented=False,
    pallas=True,
):
    """``"cudnn"``, ``"splash"`` or ``"blockwise"``: which kernel ``local_attention`` runs (a pure function).

    Splash (``zoo.kernels.splash_attention``, JAX's Pallas kernel) when ``platform`` is a
    TPU, ``pallas`` allows a Pallas kernel (False where GSPMD would partition the call over
    several devices: it cannot split a Pallas call), and ``splash_attention.supports`` the
    lengths, head dim and order, and not both a key mask (``key_masked``; default
    ``masked``) and segment ids (``segmented``).

    cuDNN when all hold: ``platform`` is a GPU ("gpu"/"cuda", as ``jax.default_backend()``
    says), ``dtype`` is bfloat16 or float16, ``head_dim`` is a multiple of 8 and <= 128,
    no key mask and no segment ids (``masked`` False: a boolean mask would cost cuDNN a
    [T, S] bias; ``jax.nn.dot_product_attention`` takes no document ids), and
    under causal masking the tokens are in natural order (``natural_order``: positions
    0..T-1 for queries and keys) with ``q_len == kv_len`` (cuDNN's causal mask is by
    array index), and no soft-capping (``softcapped``: cuDNN's scores have none).
    Otherwise the tiled kernel.
    """
    if platform in SPLASH_PLATFORMS and pallas and q_len is not None and kv_len is not None:
        if splash_attention.supports(
            q_len=q_len,
            kv_len=kv_len,
            head_dim=head_dim,
            natural_order=natural_order,
            key_masked=masked if key_masked is None else key_masked,
            segmented=segmented,
        ):
            return "splash"
    ok = (
        platform in CUDNN_PLATFORMS
        and str(jnp.dtype(dtype)) in CUDNN_DTYPES
        and head_dim % 8 == 0
        and head_dim <= CUDNN_MAX_HEAD_DIM
        and not masked
        and not softcapped
        and (not causal or (natural_order and q_len == kv_len))
    )
    return "cudnn" if ok else "blockwise"


def describe_local_attention(*, q_len, kv_len, block_size=512, cudnn=True, **choice):
    """``"cudnn"``, ``"splash (blocks 512)"``, ``"blockwise (tile 512)"`` or ``"blockwise
    (tile 256x512)"`` (query x key tiles).

    ``choice``: the other arguments of ``attention_implementation``; ``cudnn=False``
    describes a caller that runs the tiled kernel regardless (no fused kernel).
    """
    kernel = attention_implementation(q_len=q_len, kv_len=kv_len, **choice) if cudnn else "blockwise"
    if kernel == "cudnn":
        return "cudnn"
    if kernel == "splash":
        q_edge, k_edge = (splash_attention.block_edge(n) for n in (q_len, kv_len))
        return f"splash (blocks {q_edge})" if q_edge == k_edge else f"splash (blocks {q_edge}x{k_edge})"
    q_tile, k_tile = (tile_plan(length, block_size)[0] for length in (q_len, kv_len))
    return f"blockwise (tile {q_tile})" if q_tile == k_tile else f"blockwise (tile {q_tile}x{k_tile})"


def local_attention(
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
    pallas=True,
):
    """Attention on one device's arrays: cuDNN or splash where ``attention_implementation``
    allows, else tiled.

    Same arguments, shapes and result as ``blockwise_attention``; ``pallas=False`` where
    GSPMD partitions the call over several devices (no Pallas kernel then). Positions given as
    None mean natural order; they only matter under causal masking. A sliding window W
    reaches cuDNN as ``local_window_size=(W - 1, 0)`` (keys p - W + 1 .. p, causal).
    On a GPU, segment ids (packing) run the tiled kernel: ``jax.nn.dot_product_attention``
    has no document-id argument (cuDNN's packed layout is reached only through private
    APIs), and a [T, S] boolean mask would cost the memory the tiles save; splash takes
    them as its own.
    """
    platform = jax.default_backend()
    choice = attention_implementation(
        platform=platform,
        dtype=q.dtype,
        head_dim=q.shape[-1],
        causal=causal,
        masked=key_mask is not None or segment_ids is not None,
        natural_order=q_positions is None and k_positions is None,
        q_len=q.shape[1],
        kv_len=k.shape[1],
        softcapped=softcap is not None,
        key_masked=key_mask is not None,
        segmented=segment_ids is not None,
        pallas=pallas,
    )
    if choice == "splash":
        _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
        window = _checks.check_sliding_window(sliding_window, causal=causal)
        return splash_attention.splash_attention(
            q,
            k,
            v,
            causal=causal,
            scale=scale,
            sliding_window=window,
            softcap=_checks.check_softcap(softcap),
            segment_ids=segment_ids,
            kv_segment_ids=kv_segment_ids,
            key_mask=key_mask,
            interpret=platform != "tpu",  # only where a test adds this platform to SPLASH_PLATFORMS
        )
    if choice == "cudnn":
        _checks.check_shapes(q.shape, k.shape, v.shape)
        window = _checks.check_sliding_window(sliding_window, causal=causal)
        local_window = None if window is None else (window - 1, 0)
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=causal, local_window_size=local_window, implementation="cudnn"
        )
    return blockwise_attention(
        q,
        k,
        v,
        causal=causal,
        key_mask=key_mask,
        scale=scale,
        q_positions=q_positions,
        k_positions=k_positions,
        block_size=block_size,
        sliding_window=sliding_window,
        softcap=softcap,
        segment_ids=segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
