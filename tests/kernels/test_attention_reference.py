"""The reference itself: checked against jax.nn.dot_product_attention and by construction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import attention_reference

# Direct calls jitted: eager mode would compile every op separately, which is slower.
attention = jax.jit(attention_reference, static_argnames=("causal", "scale"), compiler_options=h.FAST_COMPILE)


@pytest.mark.parametrize("causal, heads, kv_heads", [(False, 4, 4), (True, 8, 2), (True, 4, 1)])
def test_matches_jax_dot_product_attention(causal, heads, kv_heads):
    q, k, v, _, cotangent = h.inputs(heads=heads, kv_heads=kv_heads, length=32)
    mask = jnp.arange(32)[None] < jnp.array([[32], [20]])  # right padding: no empty rows

    def ours(q, k, v, mask):
        return attention_reference(q, k, v, causal=causal, key_mask=mask)

    def theirs(q, k, v, mask):
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :], is_causal=causal)

    h.assert_close(
        h.output_and_grads(ours, q, k, v, mask, cotangent),
        h.output_and_grads(theirs, q, k, v, mask, cotangent),
        rtol=1e-5,
        atol=1e-5,
    )


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v, mask, _ = h.inputs(heads=8, kv_heads=2)
    grouped = attention(q, k, v, causal=True, key_mask=mask)
    repeated = attention(q, jnp.repeat(k, 4, axis=2), jnp.repeat(v, 4, axis=2), causal=True, key_mask=mask)
    np.testing.assert_allclose(grouped, repeated, rtol=1e-6, atol=1e-6)


def test_rows_that_see_no_key_are_zero_with_finite_grads():
    q, k, v, mask, cotangent = h.inputs(heads=2, kv_heads=2)  # example 0: first 5 keys padded
    out, dq, dk, dv = h.output_and_grads(h.reference(causal=True), q, k, v, mask, cotangent)
    np.testing.assert_array_equal(out[0, :5], 0.0)
    np.testing.assert_array_equal(dq[0, :5], 0.0)
    assert np.abs(out[0, 5:]).sum() > 0
    assert all(np.isfinite(x).all() for x in (out, dq, dk, dv))
    empty = attention(q, k, v, key_mask=jnp.zeros(mask.shape, bool))
    np.testing.assert_array_equal(empty, 0.0)


def test_positions_make_causality_follow_tokens_not_array_order():
    q, k, v, mask, _ = h.inputs(heads=2, kv_heads=2)
    order = np.random.default_rng(0).permutation(q.shape[1])
    natural = attention(q, k, v, causal=True, key_mask=mask)
    shuffled = attention(
        q[:, order],
        k[:, order],
        v[:, order],
        causal=True,
        key_mask=mask[:, order],
        q_positions=jnp.asarray(order),
        k_positions=jnp.asarray(order),
    )
    np.testing.assert_allclose(shuffled, natural[:, order], rtol=1e-6, atol=1e-6)


def test_bfloat16_inputs_accumulate_in_float32():
    q, k, v, mask, _ = h.inputs(heads=2, kv_heads=2, dtype="bfloat16")
    out = attention(q, k, v, causal=True, key_mask=mask)
    assert out.dtype == jnp.bfloat16
    exact = attention(*(x.astype(jnp.float32) for x in (q, k, v)), causal=True, key_mask=mask)
    # only the final rounding to bf16 differs: within one bf16 ulp (2^-8 relative)
    np.testing.assert_allclose(np.asarray(out, np.float32), exact, rtol=2**-8, atol=1e-6)
