"""Rotary position embedding: a rotation (norms kept) whose scores depend on relative position."""

import jax.numpy as jnp
import numpy as np
import pytest

from zoo.layers import apply_rotary_embedding, rotary_angles


def _x(shape=(2, 6, 3, 8), seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def test_position_zero_is_the_identity_and_norms_are_kept():
    x = _x()
    positions = jnp.arange(6)
    rotated = apply_rotary_embedding(x, positions)
    np.testing.assert_allclose(rotated[:, 0], x[:, 0], rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    assert not np.allclose(rotated[:, 1:], x[:, 1:])


def test_scores_depend_only_on_the_position_difference():
    q, k = _x((1, 1, 1, 16), 1), _x((1, 1, 1, 16), 2)

    def score(p, s):
        return float(jnp.sum(apply_rotary_embedding(q, jnp.array([p])) * apply_rotary_embedding(k, jnp.array([s]))))

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)


def test_rotate_half_layout_matches_the_formula():
    x = _x((1, 2, 1, 4))
    positions = jnp.array([3, 11])
    angles = np.asarray(rotary_angles(positions, head_dim=4, base=100.0))  # [T, 2]
    assert angles.shape == (2, 2)
    np.testing.assert_allclose(angles[1], [11.0, 11.0 / 10.0], rtol=1e-6)
    x1, x2 = np.asarray(x[..., :2]), np.asarray(x[..., 2:])
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
    expected = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    np.testing.assert_allclose(apply_rotary_embedding(x, positions, base=100.0), expected, rtol=1e-5, atol=1e-6)


def test_per_example_positions_and_dtype():
    x = _x((2, 4, 2, 8)).astype(jnp.bfloat16)
    positions = jnp.array([[0, 1, 2, 3], [8, 9, 10, 11]])
    out = apply_rotary_embedding(x, positions)
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape
    np.testing.assert_allclose(
        np.asarray(out[1], np.float32),
        np.asarray(apply_rotary_embedding(x[1:], jnp.arange(8, 12))[0], np.float32),
    )


def test_odd_head_dim_is_rejected():
    with pytest.raises(ValueError, match="rotary embedding needs an even head_dim, got head_dim 5"):
        apply_rotary_embedding(_x((1, 2, 1, 5)), jnp.arange(2))
