"""Every sequence-parallel kernel matches the single-device reference: output and grads.

Cases cover N = 8 and 4, causal and not, MHA (H = K), GQA (H=8, K=2) and MQA, with a
padding mask in which some causal rows see no key at all. Not the full cartesian
product: each strategy gets every value of each factor, and pairs of them.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import gather_kv_attention, ring_attention, ulysses_attention

# Block sizes below the local lengths, so every kernel's local step walks several tiles.
STRATEGIES = {
    "gather": (gather_kv_attention, {"block_size": 4}, None),
    "gather-striped": (gather_kv_attention, {"block_size": 8}, "striped"),
    "ring": (ring_attention, {"block_size": 4}, None),
    "ring-zigzag": (ring_attention, {"block_size": 2}, "zigzag"),
    "ring-striped": (ring_attention, {"block_size": 4}, "striped"),
    "ulysses": (ulysses_attention, {"block_size": 16}, None),
    "ulysses-zigzag": (ulysses_attention, {"block_size": 8}, "zigzag"),
}

# (devices, causal, heads, kv_heads, masked)
CASES = [
    (8, True, 8, 2, True),  # GQA on 8, causal
    (8, False, 8, 8, True),  # MHA on 8
    (4, True, 4, 4, True),  # MHA on 4, causal
    (4, False, 8, 2, True),  # GQA on 4
]


@functools.cache
def reference_results(causal, heads, kv_heads, masked, dtype="float32"):
    q, k, v, mask, cotangent = h.inputs(heads=heads, kv_heads=kv_heads, masked=masked, dtype=dtype)
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    return h.output_and_grads(h.reference(causal=causal), q, k, v, mask, cotangent)


def _case_id(case):
    n, causal, heads, kv_heads, masked = case
    return f"n{n}-{'causal' if causal else 'full'}-h{heads}k{kv_heads}{'-mask' if masked else ''}"


# Balancing changes nothing without causal masking: ring's balanced variants run the
# causal cases; gather and Ulysses (whose balancing is only positions) run one each.
PAIRS = [(s, c) for s in sorted(STRATEGIES) for c in CASES if STRATEGIES[s][2] is None]
PAIRS += [(s, c) for s in ("ring-striped", "ring-zigzag") for c in CASES if c[1]]
PAIRS += [("gather-striped", CASES[2]), ("ulysses-zigzag", CASES[0])]


@pytest.mark.parametrize("strategy, case", PAIRS, ids=[f"{s}-{_case_id(c)}" for s, c in PAIRS])
def test_matches_reference(strategy, case):
    n, causal, heads, kv_heads, masked = case
    kernel, options, balance = STRATEGIES[strategy]
    q, k, v, mask, cotangent = h.inputs(heads=heads, kv_heads=kv_heads, masked=masked)
    attention = h.sharded(kernel, n=n, balance=balance, causal=causal, **options)
    got = h.output_and_grads(attention, q, k, v, mask, cotangent)
    h.assert_close(got, reference_results(causal, heads, kv_heads, masked), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["ring-striped", "ulysses"])
def test_mqa_without_mask(strategy):
    """One KV head for 8 query heads (Ulysses repeats it to 8 for N = 8), no padding."""
    kernel, options, balance = STRATEGIES[strategy]
    q, k, v, mask, cotangent = h.inputs(heads=8, kv_heads=1, masked=False)
    attention = h.sharded(kernel, n=8, balance=balance, causal=True, **options)
    got = h.output_and_grads(attention, q, k, v, mask, cotangent)
    h.assert_close(got, reference_results(True, 8, 1, False), rtol=1e-4, atol=1e-5)


def test_fully_masked_rows_are_zero_not_nan():
    """Causal + left padding: example 0's first 5 queries see nothing, and give exactly 0."""
    q, k, v, mask, cotangent = h.inputs(heads=4, kv_heads=4)
    attention = h.sharded(ring_attention, n=4, causal=True, block_size=4)
    out, dq, dk, dv = h.output_and_grads(attention, q, k, v, mask, cotangent)
    np.testing.assert_array_equal(np.asarray(out[0, :5]), 0.0)
    np.testing.assert_array_equal(np.asarray(dq[0, :5]), 0.0)
    assert all(np.isfinite(np.asarray(x)).all() for x in (out, dq, dk, dv))


@pytest.mark.parametrize("strategy", ["ring-zigzag", "ulysses"])
def test_bfloat16_is_finite_and_close_to_float32(strategy):
    kernel, options, balance = STRATEGIES[strategy]
    q, k, v, mask, cotangent = h.inputs(heads=8, kv_heads=2, dtype="bfloat16")
    attention = h.sharded(kernel, n=8, balance=balance, causal=True, **options)
    got = h.output_and_grads(attention, q, k, v, mask, cotangent)
    assert [x.dtype for x in got] == [jnp.bfloat16] * 4
    # Reference in f32 on the same (bf16-rounded) inputs; bf16 keeps ~3 significant digits.
    h.assert_close(got, reference_results(True, 8, 2, True, "bfloat16"), rtol=5e-2, atol=5e-2)
