"""How the kernels cut queries and keys into score tiles, and which tiles causality (and a window) skips.

Shared by the kernels and by the pure-numpy replays (``load_balance.causal_block_work``,
``load_balance.ring_steps``, ``blockwise_attention.blockwise_tiles``), so the work count
a test checks is the work the kernel does. The functions taking positions work on numpy
and jax arrays alike (a kernel passes traced positions, a replay numpy ones).
"""

import jax.numpy as jnp
import numpy as np


def block_size_for(local_len, block_size, balance=None):
    """Largest divisor of the shard length (of half of it for zig-zag) that is <= block_size.

    Zig-zag shards hold two chunks of ``local_len / 2``; blocks that do not straddle the
    chunk boundary are what make whole blocks skippable.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    span = local_len // 2 if balance == "zigzag" and local_len % 2 == 0 else local_len
    size = min(block_size, span)
    while span % size:
        size -= 1
    return size


def block_has_work(q_positions, k_positions, sliding_window=None):
    """True if some query in the block may see some key under causality (and the window W).

    Works on numpy and jax arrays alike: (max query position) >= (min key position), and
    with a window (min query position) - (max key position) < W. Exact for tiles of
    consecutive positions; for others it may say True for a tile the mask then hides.
    """
    work = q_positions.max() >= k_positions.min()
    if sliding_window is not None:
        work = work & (q_positions.min() - k_positions.max() < sliding_window)
    return work


def tile_work(q_positions, k_positions, *, block_q, block_k, causal=True, sliding_window=None):
    """bool[..., Tq/bq, Tk/bk]: which (query tile, key tile) pairs ``block_has_work`` keeps.

    q_positions: i32[..., Tq], k_positions: i32[..., Tk] (numpy or jax; leading dims, e.g.
    one row per device, broadcast), cut into tiles of ``block_q`` and ``block_k``
    positions. Without ``causal`` every tile has work.
    """
    xp = np if isinstance(q_positions, np.ndarray) and isinstance(k_positions, np.ndarray) else jnp
    q_tiles = q_positions.reshape(*q_positions.shape[:-1], -1, block_q)  # [..., Tq/bq, bq]
    k_tiles = k_positions.reshape(*k_positions.shape[:-1], -1, block_k)  # [..., Tk/bk, bk]
    if not causal:
        lead = np.broadcast_shapes(q_tiles.shape[:-2], k_tiles.shape[:-2])
        return xp.ones((*lead, q_tiles.shape[-2], k_tiles.shape[-2]), dtype=bool)
    work = q_tiles.max(axis=-1)[..., :, None] >= k_tiles.min(axis=-1)[..., None, :]
    if sliding_window is not None:
        work = work & (q_tiles.min(axis=-1)[..., :, None] - k_tiles.max(axis=-1)[..., None, :] < sliding_window)
    return work


def listed_tiles(work):
    """(count i32[R], columns i32[R, C]): per row of bool[R, C], its True columns first, ascending.

    The loops of a windowed kernel run ``count[r]`` steps over ``columns[r, :count[r]]``
    instead of all C columns, so tiles outside the window are never visited at all.
    """
    xp = np if isinstance(work, np.ndarray) else jnp
    columns = xp.arange(work.shape[1], dtype=xp.int32)[None, :]  # i32[1, C]
    order = xp.argsort(xp.where(work, columns, columns + work.shape[1]), axis=1)  # unique keys
    return work.sum(axis=1).astype(xp.int32), order.astype(xp.int32)


def tile_plan(length, block_size):
    """``(tile, padded_length)`` for walking ``length`` rows in tiles of at most block_size.

    The largest divisor of ``length`` that is <= block_size, unless that divisor is under
    half of ``min(block_size, length)`` (a prime length would give tiles of 1 row); then
    the length is padded up to ``tiles * tile`` with ``tiles = ceil(length / block_size)``
    and ``tile = ceil(length / tiles)`` (fewer than ``tiles`` padding rows).
    """
    tile = block_size_for(length, block_size)
    if 2 * tile >= min(block_size, length):
        return tile, length
    tiles = -(-length // block_size)
    tile = -(-length // tiles)
    return tile, tiles * tile
