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


# --- Llama 3 rope_scaling --------------------------------------------------------------

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def test_llama3_scaling_keeps_short_stretches_long_and_blends_the_band():
    from zoo.layers.rotary_embedding import inverse_frequency

    plain = inverse_frequency(16, 500000.0)  # wavelengths 2*pi/f: 6.3, 32.4, 167, ... positions
    scaled = inverse_frequency(16, 500000.0, LLAMA3)
    wavelength = 2 * np.pi / plain
    short, band, long = wavelength < 16, (wavelength >= 16) & (wavelength <= 64), wavelength > 64
    assert short.any() and band.any() and long.any()
    np.testing.assert_array_equal(scaled[short], plain[short])
    np.testing.assert_allclose(scaled[long], plain[long] / 8.0, rtol=1e-6)
    smooth = (64 / wavelength[band] - 1.0) / 3.0  # between the two wavelengths: a blend of both
    np.testing.assert_allclose(scaled[band], (1 - smooth) * plain[band] / 8 + smooth * plain[band], rtol=1e-6)


@pytest.mark.parametrize(
    ("scaling", "named"),
    [
        ({"rope_type": "linear", "factor": 2.0}, "rope_type 'linear' is not supported"),
        ({"type": "dynamic", "factor": 2.0}, "rope_type 'dynamic' is not supported"),
        ({**LLAMA3, "factor": 0}, "factor must be a positive number"),
        ({k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}, "missing ['low_freq_factor']"),
        ({**LLAMA3, "beta": 1.0}, "unknown ['beta']"),
    ],
)
def test_other_rope_scalings_are_refused_by_name(scaling, named):
    from zoo.layers.rotary_embedding import check_rope_scaling

    with pytest.raises(ValueError) as error:
        check_rope_scaling(scaling)
    assert named in str(error.value)


def test_rotate_half_is_an_exact_product_and_bfloat16_stays_near_float32():
    """x @ P is [-x2, x1] bit for bit (one +-1 per column); the rotation in bfloat16 (x's
    dtype, as transformers computes it) is within bfloat16's rounding of float32's."""
    from zoo.layers.rotary_embedding import rotate_half_matrix

    x = _x((2, 5, 3, 8))
    halves = np.concatenate([-np.asarray(x[..., 4:]), np.asarray(x[..., :4])], axis=-1)
    np.testing.assert_array_equal(np.asarray(x @ rotate_half_matrix(8)), halves)
    positions = jnp.arange(100, 105)
    exact = apply_rotary_embedding(x, positions)
    low = apply_rotary_embedding(x.astype(jnp.bfloat16), positions)
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float32), exact, atol=3 * 2**-8 * float(jnp.max(jnp.abs(x))))
