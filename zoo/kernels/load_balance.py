"""Causal load balancing: reorder the sequence so every shard does the same attention work.

Under causal attention, cutting the sequence into N contiguous shards gives shard i work
proportional to i + 1: the last shard sees every key, the first only its own. Two
reorderings fix that. The data pipeline calls ``reorder`` on inputs (and labels) before
they are sharded and ``restore`` on outputs; kernels take ``balance=`` and compute the
global position of each token they hold with ``shard_positions``.

- ``"zigzag"`` (dual-chunk swap): cut the sequence into 2N chunks; shard i holds chunks
  i and 2N-1-i, one early and one late. Needs T divisible by 2N.
- ``"striped"``: token t goes to shard t mod N; shard i holds i, i+N, i+2N, ...
- ``None``: contiguous shards, no reordering.

Example with T = 8, N = 2 (token positions each shard holds):
    None:    shard 0 [0 1 2 3]  shard 1 [4 5 6 7]
    zigzag:  shard 0 [0 1 6 7]  shard 1 [2 3 4 5]
    striped: shard 0 [0 2 4 6]  shard 1 [1 3 5 7]
"""

import jax.numpy as jnp
import numpy as np

from zoo.kernels import _checks
from zoo.kernels._blocking import block_has_work, block_size_for, tile_work

__all__ = ["causal_block_work", "permutation", "reorder", "restore", "ring_steps", "shard_positions"]


def shard_positions(local_len, *, shard_index, num_shards, balance=None):
    """Global positions i32[local_len] of the tokens shard ``shard_index`` holds.

    ``shard_index`` may be a Python int (numpy result) or a traced value such as
    ``lax.axis_index`` inside ``shard_map`` (jax result).
    """
    _checks.check_balance(balance)
    xp = np if isinstance(shard_index, (int, np.integer)) else jnp
    local = xp.arange(local_len, dtype=xp.int32)
    if balance == "striped":
        return local * num_shards + shard_index
    if balance == "zigzag":
        chunk = local_len // 2
        first = xp.arange(chunk, dtype=xp.int32) + shard_index * chunk
        second = xp.arange(chunk, dtype=xp.int32) + (2 * num_shards - 1 - shard_index) * chunk
        return xp.concatenate([first, second])
    return local + shard_index * local_len


def permutation(seq_len, *, num_shards, balance=None):
    """i32[T]: ``reordered[j] = original[permutation[j]]``; shard i holds slice i of it."""
    _checks.check_sequence_divisible(seq_len, axis_size=num_shards, balance=balance)
    local_len = seq_len // num_shards
    return np.concatenate(
        [shard_positions(local_len, shard_index=i, num_shards=num_shards, balance=balance) for i in range(num_shards)]
    )


def reorder(x, *, num_shards, axis=1, balance="zigzag"):
    """Puts the sequence axis of ``x`` into load-balanced order before sharding.

    x: [..., T, ...] (numpy in, numpy out; jax in, jax out). Contiguous shards of the
    result hold what ``shard_positions`` says.
    """
    perm = permutation(x.shape[axis], num_shards=num_shards, balance=balance)
    return _take(x, perm, axis)


def restore(x, *, num_shards, axis=1, balance="zigzag"):
    """Inverse of ``reorder``: back to the original sequence order."""
    perm = permutation(x.shape[axis], num_shards=num_shards, balance=balance)
    return _take(x, np.argsort(perm), axis)


def _take(x, indices, axis):
    if isinstance(x, np.ndarray):
        return np.take(x, indices, axis=axis)
    return jnp.take(x, indices, axis=axis)


def causal_block_work(seq_len, *, num_shards, block_size, balance=None, sliding_window=None):
    """Score blocks each device computes in causal ring attention: i64[num_shards].

    Replays the ring schedule (at step s device i holds the K/V of shard (i - s) mod N)
    with the kernel's own block size, positions and skip test, in plain numpy. With
    balancing every device gets the same count; without it device i's grows with i.
    ``sliding_window`` W also skips the blocks no query's window reaches (the steps
    ``ring_steps`` leaves out have none).
    """
    _checks.check_sequence_divisible(seq_len, axis_size=num_shards, balance=balance)
    window = _checks.check_sliding_window(sliding_window, causal=True)
    local_len = seq_len // num_shards
    size = block_size_for(local_len, block_size, balance)
    work = np.zeros(num_shards, dtype=np.int64)
    for device in range(num_shards):
        q_blocks = _blocks(device, local_len, size, num_shards, balance)
        for step in range(num_shards):
            source = (device - step) % num_shards
            k_blocks = _blocks(source, local_len, size, num_shards, balance)
            work[device] += sum(block_has_work(qb, kb, window) for qb in q_blocks for kb in k_blocks)
    return work


def ring_steps(seq_len, *, num_shards, block_size=512, balance=None, causal=True, sliding_window=None):
    """The ring steps ring attention runs: a tuple of s in 0..N-1 (at step s device i holds shard i - s).

    Without a window every step. With a sliding window W, only the steps at which some
    device's queries can reach some key of the shard it would hold, by the kernel's own
    tiles and skip test; the others are never computed and their K/V never sent. From
    the static position layout (``balance``), in plain numpy. Contiguous shards of
    L = T/N tokens need the steps 0 .. min(N - 1, ceil((W - 1) / L)); zig-zag ones the
    steps near 0 and near N (its second chunks meet their neighbours' in reverse).
    """
    _checks.check_sequence_divisible(seq_len, axis_size=num_shards, balance=balance)
    window = _checks.check_sliding_window(sliding_window, causal=causal)
    local_len = seq_len // num_shards
    size = block_size_for(local_len, block_size, balance)
    return needed_steps(
        local_len, local_len, num_shards=num_shards, block_q=size, block_k=size, balance=balance, window=window
    )


def needed_steps(q_len, kv_len, *, num_shards, block_q, block_k, balance=None, window=None):
    """``ring_steps`` for shards of ``q_len`` queries and ``kv_len`` keys cut into the given tiles."""
    if window is None:
        return tuple(range(num_shards))
    q_pos, k_pos = (_all_shard_positions(length, num_shards, balance) for length in (q_len, kv_len))  # i32[N, L]
    steps = [0]  # a device's own shard: its diagonal always has work
    for step in range(1, num_shards):
        held = np.roll(k_pos, step, axis=0)  # i32[N, Tk]: row i is shard (i - step) mod N
        if tile_work(q_pos, held, block_q=block_q, block_k=block_k, sliding_window=window).any():
            steps.append(step)
    return tuple(steps)


def _all_shard_positions(local_len, num_shards, balance):
    """i32[N, local_len]: row i holds the positions of shard i."""
    shards = (
        shard_positions(local_len, shard_index=i, num_shards=num_shards, balance=balance) for i in range(num_shards)
    )
    return np.stack(list(shards))


def _blocks(shard, local_len, size, num_shards, balance):
    positions = shard_positions(local_len, shard_index=shard, num_shards=num_shards, balance=balance)
    return positions.reshape(local_len // size, size)
