"""How ring attention cuts a shard into score blocks, and which blocks causality skips.

Shared by the kernel and by ``load_balance.causal_block_work`` so the work count a test
checks is the work the kernel does.
"""


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


def block_has_work(q_positions, k_positions):
    """True if some query in the block may see some key under causality.

    Works on numpy and jax arrays alike: (max query position) >= (min key position).
    """
    return q_positions.max() >= k_positions.min()


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
