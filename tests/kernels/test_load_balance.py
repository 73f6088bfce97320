"""Load balancing: reorder/restore, positions per shard, and equal causal work per device."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import causal_block_work, permutation, reorder, restore, ring_attention_tiles, shard_positions


def test_permutations_match_the_documented_example():
    assert permutation(8, num_shards=2, balance=None).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert permutation(8, num_shards=2, balance="zigzag").tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert permutation(8, num_shards=2, balance="striped").tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


@pytest.mark.parametrize("balance", ["zigzag", "striped"])
def test_reorder_then_restore_is_identity(balance):
    x = np.random.default_rng(0).normal(size=(2, 3, 64, 5)).astype(np.float32)
    moved = reorder(x, num_shards=8, axis=2, balance=balance)
    assert isinstance(moved, np.ndarray) and not np.array_equal(moved, x)
    np.testing.assert_array_equal(restore(moved, num_shards=8, axis=2, balance=balance), x)
    moved_jax = reorder(jnp.asarray(x), num_shards=8, axis=2, balance=balance)
    np.testing.assert_array_equal(np.asarray(moved_jax), moved)
    np.testing.assert_array_equal(np.asarray(restore(moved_jax, num_shards=8, axis=2, balance=balance)), x)


@pytest.mark.parametrize("balance", [None, "zigzag", "striped"])
def test_each_shard_holds_the_positions_kernels_assume(balance):
    n, length = 4, 32
    moved = reorder(np.arange(length)[None], num_shards=n, axis=1, balance=balance)[0]
    local = length // n
    for i in range(n):
        expected = shard_positions(local, shard_index=i, num_shards=n, balance=balance)
        np.testing.assert_array_equal(moved[i * local : (i + 1) * local], expected)
    # and the traced version inside shard_map (axis_index) agrees with the numpy one
    body = lambda x: x + shard_positions(local, shard_index=jax.lax.axis_index(h.AXIS), num_shards=n, balance=balance)
    traced = jax.shard_map(body, mesh=h.mesh_of(n), in_specs=jax.P(h.AXIS), out_specs=jax.P(h.AXIS))
    np.testing.assert_array_equal(np.asarray(traced(jnp.zeros(length, jnp.int32))), moved)


def test_balancing_equalises_causal_work():
    """Unbalanced, device i computes ~(i + 1/2) shards of tiles; balanced, all the same."""
    plain = causal_block_work(1024, num_shards=8, block_size=16, balance=None)
    assert np.all(np.diff(plain) > 0) and plain[-1] > 8 * plain[0], plain
    for balance in ("zigzag", "striped"):
        work = causal_block_work(1024, num_shards=8, block_size=16, balance=balance)
        assert np.all(work == work[0]), (balance, work)
        # and nobody does more than the busiest unbalanced device: the skipped work is real
        assert work[0] < plain[-1] * 0.6, (balance, work, plain)


@pytest.mark.parametrize("balance", [None, "zigzag", "striped"])
def test_kernel_computes_exactly_the_counted_tiles(balance):
    """The count comes from ring attention's own lax.cond, per device, vs the numpy replay."""
    n, length, block = 4, 64, 4
    q, k, v, mask, _ = h.inputs(heads=2, kv_heads=2, length=length, masked=False)
    count = functools.partial(ring_attention_tiles, axis_name=h.AXIS, causal=True, block_size=block, balance=balance)
    per_device = jax.P(h.AXIS)
    f = jax.shard_map(
        lambda q, k, v: count(q, k, v)[None], mesh=h.mesh_of(n), in_specs=(h.SEQ,) * 3, out_specs=per_device
    )
    counted = np.asarray(jax.jit(f)(q, k, v))
    expected = causal_block_work(length, num_shards=n, block_size=block, balance=balance)
    np.testing.assert_array_equal(counted, expected)
    assert (len(set(counted.tolist())) == 1) == (balance is not None)
