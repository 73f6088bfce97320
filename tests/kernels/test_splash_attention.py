"""Splash attention (JAX's Pallas TPU kernel), run here in Pallas' interpreter: every option
against the float64 reference, outputs and gradients; the choice of kernel per platform.

The kernel is the one a TPU runs (``zoo.kernels.splash_attention``); ``interpret=True``
runs the same Pallas program on the CPU. Lengths are the smallest the kernel takes
(128: one block of the TPU's lane width; 256 where the mask must span two blocks).
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from zoo.distribution import CheckedModelParallel, make_mesh
from zoo.kernels import attention_implementation, attention_reference, describe_local_attention, local_attention
from zoo.kernels import splash_attention as splash_module
from zoo.kernels.splash_attention import COMPUTE_EDGE, block_edge, block_edges, splash_attention, supports
from zoo.layers._sequence_parallel import describe_attention

B, H, K, D = 1, 4, 2, 64  # two KV heads of two query heads each (GQA), the head dim splash takes
SEGMENTS = np.repeat(np.array([[1, 2, 2, 0]], np.int32), 64, axis=1)  # [1, 256]: two packed documents, then padding (0)

LEFT_PADDED = np.arange(256)[None] >= 100  # bool[1, 256]: causal queries 0..99 see no key (output 0)
GAP = (np.arange(256)[None] < 100) | (
    np.arange(256)[None] >= 220
)  # keys 100..219 padded: a window of 64 sees none at 163..219
RIGHT_PADDED = np.arange(128)[None] < 100  # an encoder's padded batch

# name: (length, options); every option of the kernel at least once, GQA in every case.
CASES = {
    "causal-segments-softcap": (256, dict(causal=True, segment_ids=SEGMENTS, softcap=5.0)),
    "window-scale": (256, dict(causal=True, sliding_window=100, scale=0.3)),
    "non-causal": (128, dict()),
    "causal-padding": (256, dict(causal=True, key_mask=LEFT_PADDED)),
    "window-padding": (256, dict(causal=True, sliding_window=64, key_mask=GAP)),
    "non-causal-padding": (128, dict(key_mask=RIGHT_PADDED)),
}
ARRAYS = ("segment_ids", "key_mask")  # options given as arrays


def _inputs(length):
    keys = jax.random.split(jax.random.key(length), 4)
    q = jax.random.normal(keys[0], (B, length, H, D), jnp.float32)
    k = jax.random.normal(keys[1], (B, length, K, D), jnp.float32)
    v = jax.random.normal(keys[2], (B, length, K, D), jnp.float32)
    cotangent = jax.random.normal(keys[3], (B, length, H, D), jnp.float32)
    return q, k, v, cotangent


def _output_and_grads(attention, q, k, v, cotangent):
    out, pullback = jax.vjp(attention, q, k, v)
    return (out, *pullback(cotangent.astype(out.dtype)))


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_reference(name):
    length, options = CASES[name]
    q, k, v, cotangent = _inputs(length)
    options = {key: jnp.asarray(value) if key in ARRAYS else value for key, value in options.items()}
    got = _output_and_grads(lambda *a: splash_attention(*a, interpret=True, **options), q, k, v, cotangent)
    with jax.enable_x64():
        wide = [x.astype(jnp.float64) for x in (q, k, v, cotangent)]
        want = _output_and_grads(lambda *a: attention_reference(*a, **options), *wide)
    for what, a, b in zip(("output", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float32), atol=5e-5, rtol=1e-5, err_msg=what)
    if "segment_ids" in options:  # a padding query (id 0) sees nothing: exactly 0, as the reference gives
        assert not np.asarray(got[0])[np.asarray(options["segment_ids"]) == 0].any()
    if name == "causal-padding":  # the queries before the first kept key: exactly 0, not the padded values' mean
        assert not np.asarray(got[0])[0, :100].any() and np.asarray(got[0])[0, 100:].any()


def test_the_other_layout_matches_the_reference(monkeypatch):
    """The tests above run splash's layouts at head dim 64, (D, T) blocks (``LAYOUTS``);
    (T, D) blocks, the layout at other head dims, give the reference's outputs and gradients too."""
    assert splash_module.layouts(D) == (splash_module.SEQ_MINOR,) * 3
    monkeypatch.setitem(splash_module.LAYOUTS, D, (splash_module.HEAD_DIM_MINOR,) * 3)
    test_matches_the_float64_reference("causal-segments-softcap")
    misses = splash_module._kernel.cache_info().misses
    built = splash_module._kernel(256, 256, H // K, True, None, 5.0, True, splash_module.layouts(D))
    assert splash_module._kernel.cache_info().misses == misses  # the kernel the call above ran
    sizes = built.kwargs["block_sizes"]
    assert [x.name for x in (sizes.q_layout, sizes.k_layout, sizes.v_layout)] == [splash_module.HEAD_DIM_MINOR] * 3


def test_the_kernel_serves_every_trace():
    """The kernel is built once per shape and reused: its mask tables must be concrete
    arrays, not values of the first trace that built it (a leaked tracer otherwise)."""
    q, k, v, _ = _inputs(128)
    first = jax.jit(lambda q, k, v: splash_attention(q, k, v, causal=True, interpret=True).sum())(q, k, v)
    second = jax.jit(lambda q, k, v: splash_attention(2 * q, k, v, causal=True, interpret=True).sum())(q, k, v)
    assert np.isfinite(float(first)) and np.isfinite(float(second)) and float(first) != float(second)


def test_lengths_it_cannot_take_are_refused_by_name():
    q, k, v, _ = _inputs(128)
    with pytest.raises(ValueError, match="T=100, S=100, D=64"):
        splash_attention(q[:, :100], k[:, :100], v[:, :100], interpret=True)
    with pytest.raises(ValueError, match="a key mask or segment ids, not both"):
        splash_attention(q, k, v, key_mask=jnp.asarray(RIGHT_PADDED), segment_ids=jnp.ones((1, 128), jnp.int32))


@pytest.mark.parametrize("length, edge", [(2048, 1024), (8192, 1024), (1024, 1024), (1536, 512), (384, 128)])
def test_block_edges_follow_the_measured_best(length, edge):
    assert block_edge(length) == edge


@pytest.mark.parametrize(
    "q_len, kv_len, edges",
    [(2048, 2048, (1024, 1024)), (8192, 8192, (1024, 2048)), (32768, 32768, (1024, 2048)), (1024, 9216, (1024, 1024))],
)
def test_long_key_sequences_take_key_blocks_of_2048(q_len, kv_len, edges):
    """From 8,192 causal keys on, key blocks of 2,048 where 2,048 divides the keys (9,216 =
    9 x 1,024 does not); a sliding window or a full mask, never measured so, keeps square blocks."""
    assert block_edges(q_len, kv_len) == edges
    assert block_edges(q_len, kv_len, windowed=True) == block_edges(q_len, kv_len, causal=False) == (1024, 1024)


def test_the_words_name_the_blocks_the_kernel_runs():
    """A causal 8k call's words name its key blocks of 2,048; a windowed one's, its square blocks."""
    call = dict(platform="tpu", dtype="bfloat16", head_dim=128, causal=True, q_len=8192, kv_len=8192)
    assert describe_local_attention(**call) == "splash (blocks 1024x2048)"
    assert describe_local_attention(windowed=True, **call) == "splash (blocks 1024)"


TPU = dict(platform="tpu", dtype="bfloat16", head_dim=64, causal=True, q_len=2048, kv_len=2048)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({}, "splash"),
        ({"causal": False, "dtype": "float32", "head_dim": 128}, "splash"),
        ({"softcapped": True}, "splash"),
        ({"masked": True, "key_masked": False, "segmented": True}, "splash"),  # segment ids only
        ({"masked": True}, "splash"),  # a key mask (padding), as segment ids
        ({"masked": True, "segmented": True}, "blockwise"),  # a key mask and segment ids
        ({"natural_order": False}, "blockwise"),  # causal by positions, not by index
        ({"q_len": 100, "kv_len": 100}, "blockwise"),  # not a multiple of 128
        ({"head_dim": 32}, "blockwise"),
        ({"pallas": False}, "blockwise"),  # GSPMD over several devices cannot split a Pallas call
        ({"platform": "cpu"}, "blockwise"),
    ],
)
def test_splash_choice(change, expected):
    assert attention_implementation(**{**TPU, **change}) == expected
    assert supports(q_len=128, kv_len=256, head_dim=128)


def test_describe_attention_names_splash_on_one_tpu_device_only():
    sizes = dict(seq_len=2048, head_dim=64, causal=True, dtype="bfloat16", platform="tpu")
    assert describe_attention(**sizes) == "splash (blocks 1024)"
    distribution = CheckedModelParallel(
        layout_map=keras.distribution.LayoutMap(make_mesh("data=8")), batch_dim_name="data"
    )
    keras.distribution.set_distribution(distribution)
    try:  # GSPMD partitions the plain path over 8 devices: the tiles, which it can split
        assert describe_attention(**sizes) == "blockwise (tile 512)"
    finally:
        keras.distribution.set_distribution(None)


def test_inside_a_shard_map_the_seam_runs_the_tiled_kernel(monkeypatch):
    """JAX refuses splash's ``pallas_call`` inside a ``shard_map`` that checks varying axes
    (its output shapes name none; the zoo's tensor-parallel and context kernels run there):
    the seam picks the tiled kernel there, splash outside, with splash's platforms widened
    to this CPU as a TPU has them. Outputs and gradients against the float64 reference."""
    monkeypatch.setattr(splash_module, "PLATFORMS", ("tpu", "cpu"))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    q, k, v, cotangent = (jnp.concatenate([x, x[:, ::-1]]) for x in _inputs(128))  # B = 2: a row per device
    attention = lambda q, k, v: local_attention(q, k, v, causal=True)  # noqa: E731
    split = jax.shard_map(attention, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    assert "pallas_call" in str(jax.make_jaxpr(attention)(q, k, v))  # one device: splash
    assert "pallas_call" not in str(jax.make_jaxpr(split)(q, k, v))  # its shard_map: the tiles
    got = _output_and_grads(jax.jit(split), q, k, v, cotangent)
    with jax.enable_x64():
        wide = [x.astype(jnp.float64) for x in (q, k, v, cotangent)]
        want = _output_and_grads(lambda *a: attention_reference(*a, causal=True), *wide)
    for what, a, b in zip(("output", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float32), atol=5e-5, rtol=1e-5, err_msg=what)


def test_key_blocks_longer_than_query_blocks_computed_in_parts_match_the_reference(monkeypatch):
    """Long keys' blocks (``block_edges``: 1,024 queries x 2,048 keys on the chip, each key block
    computed ``COMPUTE_EDGE`` = 512 at a time), here scaled down by the same rule to 512 queries
    x 1,024 keys over 1,024 tokens: causal, the inner steps of the forward and the fused
    backward, against the float64 reference."""
    monkeypatch.setattr(splash_module, "EDGES", (512, 256, 128))
    monkeypatch.setattr(splash_module, "LONG_KEYS", 1024)
    monkeypatch.setattr(splash_module, "LONG_KEY_EDGE", 1024)
    splash_module._kernel.cache_clear()
    assert block_edges(1024, 1024) == (512, 1024) and COMPUTE_EDGE == 512
    keys = jax.random.split(jax.random.key(7), 4)
    q = jax.random.normal(keys[0], (1, 1024, 2, D), jnp.float32)  # one KV head of two query heads
    k, v = (jax.random.normal(key, (1, 1024, 1, D), jnp.float32) for key in keys[1:3])
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    try:
        got = _output_and_grads(lambda *a: splash_attention(*a, causal=True, interpret=True), q, k, v, cotangent)
    finally:
        splash_module._kernel.cache_clear()  # no kernel of these blocks outlives the patch
    with jax.enable_x64():
        wide = [x.astype(jnp.float64) for x in (q, k, v, cotangent)]
        want = _output_and_grads(lambda *a: attention_reference(*a, causal=True), *wide)
    for what, a, b in zip(("output", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float32), atol=5e-5, rtol=1e-5, err_msg=what)
