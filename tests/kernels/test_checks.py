"""Bad shapes fail early with errors that name the numbers, before and inside shard_map."""

import functools

import jax
import jax.numpy as jnp
import pytest

from tests.kernels import _harness as h
from zoo.kernels import (
    attention_reference,
    check_heads_divisible,
    check_kv_heads,
    check_sequence_divisible,
    check_sequence_parallel,
    gather_kv_attention,
    reorder,
    ring_attention,
    ulysses_attention,
)


def test_sequence_not_divisible_by_axis():
    with pytest.raises(ValueError, match="sequence length 1001 is not divisible by the 'seq' mesh axis of size 8$"):
        check_sequence_divisible(1001, axis_size=8, axis_name="seq")
    check_sequence_divisible(1000, axis_size=8)  # 1000 = 8 x 125; striped/None need only N


def test_zigzag_needs_twice_the_axis_size():
    with pytest.raises(
        ValueError, match=r"sequence length 1000 is not divisible by 2 x the 'seq' mesh axis of size 8 = 16"
    ):
        check_sequence_divisible(1000, axis_size=8, axis_name="seq", balance="zigzag")
    check_sequence_divisible(1000, axis_size=8, balance="striped")


def test_heads_not_divisible_for_ulysses():
    with pytest.raises(ValueError, match="number of heads 6 is not divisible by the 'model' mesh axis of size 4"):
        check_heads_divisible(6, axis_size=4, axis_name="model")


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="num_kv_heads 3 does not divide num_heads 8"):
        check_kv_heads(8, 3)
    q, k = jnp.zeros((1, 4, 8, 2)), jnp.zeros((1, 4, 3, 2))
    with pytest.raises(ValueError, match="num_kv_heads 3 does not divide num_heads 8"):
        attention_reference(q, k, k)


def test_key_mask_shape_is_checked():
    q = jnp.zeros((2, 4, 2, 8))
    with pytest.raises(ValueError, match=r"key_mask shape \(2, 5\) must be \(batch, kv length\) = \(2, 4\)"):
        attention_reference(q, q, q, key_mask=jnp.ones((2, 5), bool))


@pytest.mark.parametrize(
    "context_attention, kwargs, message",
    [
        ("ring", dict(seq_len=1001), "sequence length 1001 is not divisible by the 'seq' mesh axis of size 8"),
        ("gather", dict(seq_len=1000, balance="zigzag"), "sequence length 1000 is not divisible by 2 x"),
        ("ulysses", dict(num_heads=12), "number of heads 12 is not divisible by the 'seq' mesh axis of size 8"),
        ("ring", dict(num_kv_heads=3), "num_kv_heads 3 does not divide num_heads 8"),
        ("ring", dict(balance="spiral"), "balance must be one of"),
        ("flash", {}, r"context_attention must be one of \['gather', 'ring', 'ulysses'\], got 'flash'"),
    ],
)
def test_check_sequence_parallel_on_global_shapes(context_attention, kwargs, message):
    sizes = dict(seq_len=1024, num_heads=8, num_kv_heads=2, axis_size=8, axis_name="seq") | kwargs
    with pytest.raises(ValueError, match=message):
        check_sequence_parallel(context_attention, **sizes)


def test_valid_sizes_pass():
    for context_attention in ("gather", "ring", "ulysses"):
        check_sequence_parallel(
            context_attention, seq_len=1024, num_heads=8, num_kv_heads=1, axis_size=8, balance="zigzag"
        )


def _trace_sharded(kernel, *, length, heads, kv_heads, n=8, **options):
    """Traces (no compile) kernel under shard_map on global shapes, to reach its inside checks."""
    q = jax.ShapeDtypeStruct((1, length, heads, 4), jnp.float32)
    k = jax.ShapeDtypeStruct((1, length, kv_heads, 4), jnp.float32)
    body = functools.partial(kernel, axis_name=h.AXIS, **options)
    f = jax.shard_map(body, mesh=h.mesh_of(n), in_specs=(h.SEQ,) * 3, out_specs=h.SEQ)
    jax.jit(f).trace(q, k, k)


def test_inside_shard_map_zigzag_odd_shards_are_refused():
    with pytest.raises(
        ValueError, match="sequence length 72 is not divisible by 2 x the 'seq' mesh axis of size 8 = 16"
    ):
        _trace_sharded(ring_attention, length=72, heads=2, kv_heads=2, causal=True, balance="zigzag")
    with pytest.raises(ValueError, match="sequence length 72 is not divisible by 2 x"):
        _trace_sharded(gather_kv_attention, length=72, heads=2, kv_heads=2, balance="zigzag")


def test_inside_shard_map_ulysses_heads_are_checked():
    with pytest.raises(ValueError, match="number of heads 6 is not divisible by the 'seq' mesh axis of size 4"):
        _trace_sharded(ulysses_attention, length=16, heads=6, kv_heads=6, n=4)


def test_reorder_refuses_lengths_it_cannot_split():
    with pytest.raises(
        ValueError, match="sequence length 24 is not divisible by 2 x the 'seq' mesh axis of size 8 = 16"
    ):
        reorder(jnp.zeros((1, 24)), num_shards=8, balance="zigzag")
