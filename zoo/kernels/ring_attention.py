"""Ring attention: K/V shards travel around the mesh axis; memory stays O(T/N) per device.

Forward: N ring steps. At step s device i holds the K/V (and key padding mask, and the
keys' document ids when packed) of shard
(i - s) mod N; it folds them into a float32 online softmax (running max, sum and
weighted values, rescaled whenever the max grows) for its own queries, tile by tile
(``_ring_blocks``), while ``ppermute`` already ships the K/V to device i + 1 for the
next step. N - 1 hops in all; on an axis of size 1 none (no collective is emitted).

Backward (``jax.custom_vjp``): saves only q, k, v, the mask, the output and the
log-sum-exp (all O(T/N)); then runs the ring again. K/V travel as before, and with them
f32 dK/dV accumulators that each device adds its queries' share to. After N hops (one
more than K/V need) every accumulator is back on the device owning that shard.
Probabilities are recomputed per tile as exp(score - lse), flash-attention style.

Causal tiles that no query may see are skipped with ``lax.cond`` (see ``_ring_blocks``);
with ``balance="zigzag"`` or ``"striped"`` (see ``load_balance``) every device skips the
same number.

Sliding window W: tiles outside every query's window are not visited, and whole ring
steps are dropped: ``load_balance.ring_steps`` says, from the static position layout,
at which steps any device's queries can reach the keys it would hold. The K/V go
straight from one kept step to the next (one ``ppermute`` by the difference of the
steps), and the dK/dV accumulators come home with one ``ppermute`` after the last. With
contiguous shards of L = T/N tokens that is ceil((W - 1) / L) hops instead of N - 1.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zoo.kernels import _checks
from zoo.kernels._blocking import block_size_for
from zoo.kernels._masking import segment_pair
from zoo.kernels._online_softmax import F32
from zoo.kernels._ring_blocks import (
    TileConfig,
    backward_shard,
    finish_forward,
    forward_shard,
    start_backward,
    start_forward,
)
from zoo.kernels.load_balance import needed_steps, shard_positions

__all__ = ["ring_attention", "ring_attention_tiles"]


class _RingConfig(NamedTuple):
    """Static (hashable) settings, passed to the custom VJP as a non-differentiable arg."""

    axis_name: str
    causal: bool
    scale: float
    block_size: int
    balance: object  # None, "zigzag" or "striped"
    window: object = None  # None or the sliding window W (an int)
    softcap: object = None  # None or c: scores c * tanh(scores / c) (Gemma 2)


def ring_attention(
    q,
    k,
    v,
    *,
    axis_name,
    causal=False,
    key_mask=None,
    scale=None,
    block_size=512,
    balance=None,
    sliding_window=None,
    softcap=None,
    segment_ids=None,
):
    """Attention over a sequence split along ``axis_name``; call inside ``jax.shard_map``.

    Shapes: global q [B, T, H, D], k/v [B, T, K, D], key_mask bool[B, T]; with the
    sequence sharded over N devices this function sees one shard: q [B, T/N, H, D],
    k/v [B, T/N, K, D], key_mask bool[B, T/N] (True keeps the key).

    Args:
        axis_name: mesh axis the sequence is split over (N = its size).
        causal: causal masking by global position.
        key_mask: optional key padding mask (shard of it), or None.
        scale: multiplies q.k (a Python number: it is static); defaults to 1 / sqrt(D).
        block_size: tile edge for queries and keys. Each shard is walked in tiles of the
            largest divisor of T/N (of T/2N for zig-zag) that is <= block_size, so the
            largest score array alive is f32[B, K, H/K, tile, tile].
        balance: None (contiguous shards), "zigzag" or "striped": how the caller laid
            the sequence out (``load_balance.reorder``); sets each token's position.
        sliding_window: None, or W >= 1 with ``causal``: a query at position p sees keys
            at p - W < k <= p. Ring steps whose keys no query can reach are skipped,
            compute and ``ppermute`` alike (``load_balance.ring_steps``).
        softcap: None, or c > 0: every tile's scores c * tanh(scores / c) before the mask.
        segment_ids: i32[B, T/N] (this shard's part of i32[B, T]) document ids of the
            packed rows (0 = padding), or None: a query sees only keys of its own
            document. The queries' ids stay home; a copy travels with K/V as the keys'
            ids (forward and backward), like ``key_mask``.

    Returns:
        [B, T/N, H, D] in q's dtype: this shard's rows of the global attention output.
        Gradients (custom VJP) keep per-device memory O(T/N) too.

    Causal tiles nobody can see are skipped with ``lax.cond``; under ``jax.vmap`` a
    cond turns into a select that runs both branches, so do not vmap this kernel.
    """
    _checks.check_balance(balance)
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    cfg = _RingConfig(axis_name, bool(causal), scale, int(block_size), balance, window, _checks.check_softcap(softcap))
    segment_ids, _ = segment_pair(segment_ids, None, q_shape=q.shape, k_shape=k.shape)  # i32[B, T/N] or None
    return _ring(q, k, v, key_mask, segment_ids, cfg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _ring(q, k, v, key_mask, segment_ids, cfg):
    out, _, _ = ring_forward(q, k, v, key_mask, cfg, segment_ids)
    return out


def _layout(q, k, cfg):
    """Checks the reconstructed global shapes; returns (N, my index, tiles, q positions, hop segments)."""
    n = jax.lax.axis_size(cfg.axis_name)
    _checks.check_shard_lengths(q.shape[1], k.shape[1], axis_size=n, axis_name=cfg.axis_name, balance=cfg.balance)
    me = jax.lax.axis_index(cfg.axis_name)
    tiles = TileConfig(
        cfg.causal,
        cfg.scale,
        block_size_for(q.shape[1], cfg.block_size, cfg.balance),
        block_size_for(k.shape[1], cfg.block_size, cfg.balance),
        cfg.window,
        cfg.softcap,
    )
    q_pos = shard_positions(q.shape[1], shard_index=me, num_shards=n, balance=cfg.balance)
    steps = needed_steps(
        q.shape[1],
        k.shape[1],
        num_shards=n,
        block_q=tiles.block_q,
        block_k=tiles.block_k,
        balance=cfg.balance,
        window=cfg.window,
    )
    return n, me, tiles, q_pos, _hop_segments(steps)


def _hop_segments(steps):
    """Runs of equal hops between the ring steps visited: ``((start, shift, hops), ...)``.

    Steps (0, 1, 2, ..., N-1), every step without a window, give the one loop
    ((0, 1, N-1)): N - 1 hops of one device. A window that drops steps makes fewer, or
    longer hops: (0, 1, 2, 7) on N = 8 gives ((0, 1, 2), (2, 5, 1)).
    """
    segments = []
    for before, after in zip(steps, steps[1:]):
        shift = after - before
        if segments and segments[-1][1] == shift:
            start, _, hops = segments[-1]
            segments[-1] = (start, shift, hops + 1)
        else:
            segments.append((before, shift, 1))
    return tuple(segments)


def _rotate(tree, axis_name, n, shift=1):
    """Sends every array in ``tree`` ``shift`` devices on along the ring (i -> i + shift mod N).

    A shift of 0 mod N (a ring of one device) is the array itself: no collective is emitted.
    """
    if shift % n == 0:
        return tree
    perm = [(i, (i + shift) % n) for i in range(n)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, axis_name, perm), tree)


def _key_positions(step, me, n, length, cfg):
    """Positions of the K/V shard device ``me`` holds at ring step ``step``."""
    return shard_positions(length, shard_index=(me - step) % n, num_shards=n, balance=cfg.balance)


def ring_forward(q, k, v, key_mask, cfg, segment_ids=None):
    """Forward ring; returns (out [B, T/N, H, D], lse f32[B, K, G, T/N], tiles computed i32).

    segment_ids: i32[B, T/N] or None, this shard's document ids (queries' and keys')."""
    n, me, tiles, q_pos, segments = _layout(q, k, cfg)
    kv_len = k.shape[1]
    qg, state, count = start_forward(q, k.shape[2])  # [B, T/N, K, G, D], state over T/N queries

    def visit(step, kv, carry):
        k, v, key_mask, k_seg = kv
        k_pos = _key_positions(step, me, n, kv_len, cfg)
        return forward_shard(qg, k, v, key_mask, q_pos, k_pos, *carry, tiles, segment_ids, k_seg)

    def segment(start, shift):
        def body(hop, carry):
            kv, acc = carry
            incoming = _rotate(kv, cfg.axis_name, n, shift)  # no data dependence: overlaps compute
            return incoming, visit(start + shift * hop, kv, acc)

        return body

    # carry: k, v [B, T/N, K, D] + mask bool[B, T/N] + key ids i32[B, T/N] (travelling; None
    # leaves send nothing); state over T/N queries.
    # On one device (or a window that keeps only step 0) nothing rotates: no collective.
    kv, carry, step = (k, v, key_mask, segment_ids), (state, count), 0
    for start, shift, hops in segments:
        kv, carry = jax.lax.fori_loop(0, hops, segment(start, shift), (kv, carry))
        step = start + shift * hops
    state, count = visit(step, kv, carry)
    out, lse = finish_forward(state, q.dtype)
    return out, lse, count


def _ring_fwd(q, k, v, key_mask, segment_ids, cfg):
    out, lse, _ = ring_forward(q, k, v, key_mask, cfg, segment_ids)
    return out, (q, k, v, key_mask, segment_ids, out, lse)


def _ring_bwd(cfg, residuals, d_out):
    q, k, v, key_mask, segment_ids, out, lse = residuals
    n, me, tiles, q_pos, segments = _layout(q, k, cfg)
    kv_len = k.shape[1]
    # [B, T/N, K, G, D] grouped q and d_out, delta f32[B, K, G, T/N], dq f32 (stays home)
    qg, dog, delta, dq = start_backward(q, out, d_out, k.shape[2])
    dkv = (jnp.zeros_like(k, dtype=F32), jnp.zeros_like(v, dtype=F32))  # f32[B, T/N, K, D], travel

    def visit(step, kv, dq, dkv):
        k, v, key_mask, k_seg = kv  # the shard held now, its mask and its keys' ids
        k_pos = _key_positions(step, me, n, kv_len, cfg)
        grads = (dq, *dkv)
        return backward_shard(qg, dog, lse, delta, k, v, key_mask, q_pos, k_pos, grads, tiles, segment_ids, k_seg)

    def segment(start, shift):
        def body(hop, carry):
            kv, dkv, dq = carry
            incoming = _rotate(kv, cfg.axis_name, n, shift)
            dq, dk, dv = visit(start + shift * hop, kv, dq, dkv)
            return incoming, _rotate((dk, dv), cfg.axis_name, n, shift), dq

        return body

    kv, step = (k, v, key_mask, segment_ids), 0  # the keys' ids travel as in the forward ring
    for start, shift, hops in segments:
        kv, dkv, dq = jax.lax.fori_loop(0, hops, segment(start, shift), (kv, dkv, dq))
        step = start + shift * hops
    dq, dk, dv = visit(step, kv, dq, dkv)
    # Home to their owner: the shard held at the last step is (me - step); without a
    # window that is the N-th hop of one device.
    dk, dv = _rotate((dk, dv), cfg.axis_name, n, -step)
    dq = dq.reshape(q.shape)  # f32[B, T/N, K, G, D] -> [B, T/N, H, D]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention_tiles(
    q, k, v, *, axis_name, causal=False, key_mask=None, block_size=512, balance=None, sliding_window=None
):
    """i32 count of score tiles this device computes in ``ring_attention``'s forward pass.

    Same code path as the kernel (the count is carried through its ``lax.cond``, or its
    windowed tile lists), so a test or benchmark can read the real per-device work;
    same arguments and shapes.
    """
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    cfg = _RingConfig(axis_name, bool(causal), q.shape[-1] ** -0.5, int(block_size), balance, window)
    return ring_forward(q, k, v, key_mask, cfg)[2]
