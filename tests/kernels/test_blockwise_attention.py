"""Blockwise (tiled, online-softmax) attention: reference parity, O(T x tile) memory, size-1 axes, cuDNN choice.

Measured (jax 0.10.2, CPU, T=8192, B=1, H=2, K=1, D=16, causal, forward + backward):
    attention_reference: temp 2,685,534,208 bytes; blockwise_attention (tile 512): 9,901,416 bytes.
"""

import functools
import re

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.kernels import _harness as h
from zoo.distribution import CheckedModelParallel, make_mesh
from zoo.kernels import (
    attention_implementation,
    attention_reference,
    blockwise_attention,
    gather_kv_attention,
    permutation,
    ring_attention,
    ulysses_attention,
)
from zoo.layers._sequence_parallel import describe_attention

# (causal, heads, kv_heads, length, block_size, positions, dtype): every branch once.
CASES = {
    "causal-gqa-4tiles": (True, 8, 2, 64, 16, None, "float32"),
    "full-mha-8tiles": (False, 4, 4, 64, 8, None, "float32"),
    "causal-mqa-padded": (True, 4, 1, 13, 4, None, "float32"),  # 13 is prime: padded to 4 tiles of 4
    "causal-zigzag-positions": (True, 4, 2, 64, 8, "zigzag", "float32"),
    "causal-gqa-bfloat16": (True, 8, 2, 64, 16, None, "bfloat16"),
}


def _positions(kind, length):
    return None if kind is None else jnp.asarray(permutation(length, num_shards=4, balance=kind))


def _run(kernel, case, **options):
    causal, heads, kv_heads, length, _, kind, dtype = case
    q, k, v, mask, cotangent = h.inputs(heads=heads, kv_heads=kv_heads, length=length, dtype=dtype)
    positions = _positions(kind, length)

    def attention(q, k, v, key_mask):
        return kernel(
            q, k, v, causal=causal, key_mask=key_mask, q_positions=positions, k_positions=positions, **options
        )

    return h.output_and_grads(attention, q, k, v, mask, cotangent)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
    case = CASES[name]
    got = _run(blockwise_attention, case, block_size=case[4])
    # Reference in f32 on the same (for bf16: bf16-rounded) inputs.
    expected = _run(lambda q, k, v, **kw: attention_reference(*(x.astype(jnp.float32) for x in (q, k, v)), **kw), case)
    assert got[0].dtype == jnp.dtype(case[6])
    tolerance = 5e-2 if case[6] == "bfloat16" else 1e-5
    h.assert_close(got, expected, rtol=max(tolerance, 1e-4), atol=tolerance)
    if case[0]:  # causal + example 0 left-padded by 5: its first 5 queries see nothing
        np.testing.assert_array_equal(np.asarray(got[0][0, :5], np.float32), 0.0)
        np.testing.assert_array_equal(np.asarray(got[1][0, :5], np.float32), 0.0)


def test_positions_of_the_wrong_shape_are_refused():
    q = jnp.zeros((1, 8, 2, 4))
    with pytest.raises(ValueError, match=r"q_positions shape \(1, 8\) must be \(length,\) = \(8,\)"):
        blockwise_attention(q, q, q, q_positions=jnp.zeros((1, 8), jnp.int32))


# --- memory: O(T x tile), never [T, T] ----------------------------------------------------

T, B, H, K, D = 8192, 1, 2, 1, 16


def _temp_bytes(kernel):
    q = jax.ShapeDtypeStruct((B, T, H, D), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, T, K, D), jnp.float32)

    def step(q, k, v, d_out):
        _, pullback = jax.vjp(functools.partial(kernel, causal=True), q, k, v)
        return pullback(d_out)

    return jax.jit(step).lower(q, kv, kv, q).compile().memory_analysis().temp_size_in_bytes


def test_memory_stays_far_below_one_score_matrix():
    one_scores = T * T * 4  # one f32[T, T]: 256 MiB
    blockwise, reference = _temp_bytes(blockwise_attention), _temp_bytes(attention_reference)
    assert reference > one_scores, (blockwise, reference)
    assert blockwise < one_scores / 16, (blockwise, reference)


# --- a sequence axis of size 1 emits no collective ----------------------------------------

COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)(-start)?\(")


@pytest.mark.parametrize("kernel", [ring_attention, gather_kv_attention, ulysses_attention], ids=lambda f: f.__name__)
def test_size_one_axis_emits_no_collective(kernel):
    q, k, v, mask, cotangent = h.inputs(heads=4, kv_heads=2, length=16)

    def body(q, k, v, key_mask):
        return kernel(q, k, v, axis_name=h.AXIS, causal=True, key_mask=key_mask, block_size=8)

    f = jax.shard_map(body, mesh=h.mesh_of(1), in_specs=(h.SEQ,) * 3 + (P(None, h.AXIS),), out_specs=h.SEQ)

    def step(q, k, v, key_mask, d_out):
        _, pullback = jax.vjp(lambda q, k, v: f(q, k, v, key_mask), q, k, v)
        return pullback(d_out)

    hlo = jax.jit(step).lower(q, k, v, mask, cotangent).compile().as_text()
    assert not COLLECTIVE.findall(hlo), [line for line in hlo.splitlines() if COLLECTIVE.search(line)][:5]


# --- cuDNN or tiles: a pure function of platform, dtype, sizes and options ----------------


GPU_OK = dict(platform="gpu", dtype="bfloat16", head_dim=64, causal=True, q_len=2048, kv_len=2048)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({}, "cudnn"),
        ({"dtype": "float16", "causal": False, "natural_order": False, "q_len": 256}, "cudnn"),
        ({"platform": "cpu"}, "blockwise"),
        ({"platform": "tpu", "head_dim": 60}, "blockwise"),  # splash on a TPU: tests/kernels/test_splash_attention.py
        ({"dtype": "float32"}, "blockwise"),
        ({"head_dim": 160}, "blockwise"),
        ({"head_dim": 60}, "blockwise"),
        ({"masked": True}, "blockwise"),
        ({"natural_order": False}, "blockwise"),  # causal by positions, not by index
        ({"q_len": 256}, "blockwise"),  # causal with T != S
    ],
)
def test_cudnn_choice(change, expected):
    assert attention_implementation(**{**GPU_OK, **change}) == expected


def test_describe_attention_names_the_kernel():
    sizes = dict(seq_len=2048, head_dim=64, causal=True)
    assert describe_attention(**sizes) == "blockwise (tile 512)"  # this CPU process
    assert describe_attention(**sizes, dtype="bfloat16", platform="gpu") == "cudnn"
    mesh = make_mesh("data=2,seq=4")
    distribution = CheckedModelParallel(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="data")
    keras.distribution.set_distribution(distribution)
    try:
        assert (
            describe_attention(**sizes, context_attention="ring", balance="zigzag") == "ring over 'seq' (N=4, tile 256)"
        )
        assert describe_attention(**sizes, context_attention="gather", block_size=128) == (
            "all-gather over 'seq' (N=4), then blockwise (tile 128)"
        )
        assert describe_attention(**sizes, context_attention="ulysses", dtype="bfloat16", platform="gpu") == (
            "Ulysses over 'seq' (N=4), then cudnn"
        )
    finally:
        keras.distribution.set_distribution(None)
