"""Attention-logit soft-capping (Gemma 2): scores c * tanh(scale * q.k / c) before the mask.

The reference against the formula written out; every tiled kernel (blockwise, ring with
and without balancing, gather, Ulysses) against the reference, output and gradients
(the tiles' backward multiplies by 1 - tanh^2), with a key mask, a window and a scale.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import (
    attention_implementation,
    attention_reference,
    blockwise_attention,
    gather_kv_attention,
    ring_attention,
    ulysses_attention,
)

SCALE, SOFTCAP, WINDOW = 0.5, 2.0, 12  # scores of std ~2: the cap of 2 bends them
SHAPES = dict(heads=4, kv_heads=2, length=32)  # example 1 keeps 12 keys (h.padding_mask)
OPTIONS = dict(causal=True, scale=SCALE, softcap=SOFTCAP, sliding_window=WINDOW)


def _inputs():
    return h.inputs(**SHAPES)


def test_reference_caps_the_scores_before_the_mask():
    q, k, v, mask, _ = _inputs()
    got = attention_reference(q, k, v, key_mask=mask, **OPTIONS)
    kv = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)  # (B, S, H, D)
    scores = SOFTCAP * jnp.tanh(jnp.einsum("bthd,bshd->bhts", q, kv[0]) * SCALE / SOFTCAP)  # f32[B, H, T, S]
    t, s = jnp.arange(32)[:, None], jnp.arange(32)[None, :]
    visible = (s <= t) & (s > t - WINDOW) & mask[:, None, None, :]  # bool[B, 1, T, S]
    weights = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    expected = jnp.einsum("bhts,bshd->bthd", jnp.nan_to_num(weights), kv[1])  # rows that see nothing: 0
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)
    uncapped = attention_reference(q, k, v, key_mask=mask, **{**OPTIONS, "softcap": None})
    assert np.abs(np.asarray(uncapped) - np.asarray(got)).max() > 1e-2  # the cap changes the numbers


def test_every_kernel_matches_the_reference_with_gradients():
    q, k, v, mask, cotangent = _inputs()
    reference = lambda q, k, v, key_mask: attention_reference(q, k, v, key_mask=key_mask, **OPTIONS)  # noqa: E731
    blockwise = lambda q, k, v, key_mask: blockwise_attention(q, k, v, key_mask=key_mask, block_size=8, **OPTIONS)  # noqa: E731
    plain = [
        reference,
        blockwise,
        *(
            h.sharded(kernel, n=2, block_size=8, **OPTIONS)
            for kernel in (ring_attention, gather_kv_attention, ulysses_attention)
        ),
    ]
    results = h.outputs_and_grads(plain, q, k, v, mask, cotangent)
    for got in results[1:]:
        h.assert_close(got, results[0], rtol=1e-4, atol=1e-5)
    (zigzag,) = h.outputs_and_grads(
        [h.sharded(ring_attention, n=2, balance="zigzag", block_size=4, **OPTIONS)], q, k, v, mask, cotangent
    )
    h.assert_close(zigzag, results[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("softcap", [0.0, -1.0, float("inf"), True, "50"])
def test_a_bad_softcap_is_refused(softcap):
    q, k, v, _, _ = _inputs()
    with pytest.raises(ValueError, match="softcap must be None or a finite number > 0"):
        blockwise_attention(q, k, v, softcap=softcap)


def test_cudnn_is_not_chosen_for_softcapped_scores():
    choice = dict(platform="gpu", dtype="bfloat16", head_dim=64, causal=True, q_len=128, kv_len=128)
    assert attention_implementation(**choice) == "cudnn"
    assert attention_implementation(**choice, softcapped=True) == "blockwise"
