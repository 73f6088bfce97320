"""Shared pieces of the MultiHeadAttention tests: meshes, inputs, outputs and gradients.

Sizes are small (B=2, T=32, C=16, D=8) so every sharded compile stays cheap on 2 cores.
"""

import functools
import math

import jax
import keras
import numpy as np

from tests.kernels._harness import FAST_COMPILE, padding_mask
from zoo.distribution import CheckedModelParallel, make_mesh, parse_mesh_spec
from zoo.layers import MultiHeadAttention

BATCH, LENGTH, CHANNELS, HEAD_DIM = 2, 32, 16, 8
BLOCK = 4  # ring tile edge: several tiles per shard at T=32

# Float32 tolerances (as the kernel tests): sums split across devices change order.
RTOL, ATOL = 1e-4, 1e-5


def distribution(spec):
    """``CheckedModelParallel`` with an empty layout map on the first N devices of ``spec``.

    ``"data=2,seq=4"`` uses all 8 devices, ``"data=1,seq=4"`` the first 4.
    """
    count = math.prod(size for _, size in parse_mesh_spec(spec))
    mesh = make_mesh(spec, devices=jax.devices()[:count])
    return CheckedModelParallel(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="data")


def mesh_size(spec, axis="seq"):
    return dict(parse_mesh_spec(spec)).get(axis, 1)


@functools.cache
def inputs(masked=True, batch=BATCH, length=LENGTH, seed=0):
    """(x f32[B, T, C], key_mask bool[B, T] or None, cotangent f32[B, T, C])."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, length, CHANNELS)).astype("float32")
    cotangent = rng.standard_normal((batch, length, CHANNELS)).astype("float32")
    mask = np.asarray(padding_mask(batch, length)) if masked else None
    return x, mask, cotangent


def make_layer(**options):
    """A built layer named "mha" (so weight paths agree across instances), seeded weights."""
    options = {"num_heads": 4, "head_dim": HEAD_DIM, "ring_block_size": BLOCK, "name": "mha"} | options
    layer = MultiHeadAttention(**options)
    layer.build((BATCH, LENGTH, CHANNELS))
    return layer


def reference_weights(layer_options, seed=1):
    """Weights of a layer built with no distribution (random, not Glorot's symmetric ones)."""
    layer = make_layer(**layer_options)
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(w.shape).astype("float32") * 0.3 for w in layer.get_weights()]


def output_and_grads(layer_options, weights, x, key_mask, cotangent, dist=None, segment_ids=None):
    """(out, dx, {path: dweight}) of ``sum(layer(x, key_mask, segment_ids) * cotangent)``.

    The layer is built under ``dist`` (its variables placed as the distribution says),
    given ``weights``, and run inside one ``jax.jit`` of the forward and backward pass
    while ``dist`` is the global distribution.
    """
    keras.distribution.set_distribution(dist)
    try:
        layer = make_layer(**layer_options)
        layer.set_weights(weights)
        paths = [v.path for v in layer.trainable_variables]

        @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
        def both(x, values, key_mask, cotangent, segment_ids):
            def forward(x, values):
                return layer.stateless_call(values, [], x, key_mask=key_mask, segment_ids=segment_ids)[0]

            out, pullback = jax.vjp(forward, x, values)
            dx, dvalues = pullback(cotangent)
            return out, dx, dvalues

        out, dx, dvalues = both(x, [v.value for v in layer.trainable_variables], key_mask, cotangent, segment_ids)
        return np.asarray(out), np.asarray(dx), {p: np.asarray(g) for p, g in zip(paths, dvalues)}
    finally:
        keras.distribution.set_distribution(None)


def assert_same(got, expected, rtol=RTOL, atol=ATOL):
    """Compares two ``output_and_grads`` results: output, input gradient, every weight gradient."""
    (out, dx, dw), (out_ref, dx_ref, dw_ref) = got, expected
    assert sorted(dw) == sorted(dw_ref)
    named = [("output", out, out_ref), ("d input", dx, dx_ref)]
    named += [(f"d {path}", dw[path], dw_ref[path]) for path in sorted(dw)]
    for name, a, e in named:
        assert np.all(np.isfinite(a)), f"{name} has non-finite values"
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=name)
