"""MultiHeadAttention: the shared layer harness, variable paths, config, and errors that name numbers."""

import keras
import numpy as np
import pytest

from tests.layers import _attention as a
from tests.layers.harness import check_layer_contract
from zoo.kernels import attention_reference
from zoo.layers import MultiHeadAttention

B, T, C = 4, 16, 16


@pytest.mark.parametrize(
    "init_kwargs, num_weights, with_mask",
    [
        (dict(num_heads=4, head_dim=8, num_kv_heads=2, causal=True, rotary=True, qk_norm=True), 6, True),
        (dict(num_heads=2, head_dim=6, use_bias=True, context_attention="ring", balance="striped"), 8, False),
    ],
    ids=["gqa-causal-rope-mask-qk_norm", "bias-ring"],
)
def test_layer_harness(init_kwargs, num_weights, with_mask, tmp_path):
    heads, kv_heads, d = (
        init_kwargs["num_heads"],
        init_kwargs.get("num_kv_heads", init_kwargs["num_heads"]),
        init_kwargs["head_dim"],
    )
    shapes = {
        "query/kernel": (C, heads, d),
        "key/kernel": (C, kv_heads, d),
        "value/kernel": (C, kv_heads, d),
        "output/kernel": (heads, d, C),
    }
    if init_kwargs.get("qk_norm"):
        shapes |= {"query_norm/scale": (d,), "key_norm/scale": (d,)}
    if init_kwargs.get("use_bias"):
        shapes |= {
            "query/bias": (heads, d),
            "key/bias": (kv_heads, d),
            "value/bias": (kv_heads, d),
            "output/bias": (C,),
        }
    mask = np.arange(T)[None, :] < np.array([[T], [T - 3], [T], [5]])  # bool[B, T], right padding
    check_layer_contract(
        MultiHeadAttention,
        init_kwargs=init_kwargs,
        input_shape=(B, T, C),
        expected_output_shape=(B, T, C),
        expected_num_trainable_weights=num_weights,
        expected_weight_shapes=shapes,
        call_inputs={"key_mask": mask} if with_mask else None,
        save_dir=tmp_path,
    )


def test_variable_paths_are_stable():
    layer = MultiHeadAttention(num_heads=2, head_dim=4, use_bias=True, name="attention")
    layer.build((None, None, 8))
    assert [v.path for v in layer.weights] == [
        f"attention/{proj}/{w}" for proj in ("query", "key", "value", "output") for w in ("kernel", "bias")
    ]


def test_config_keeps_every_argument():
    kwargs = dict(
        num_heads=8,
        head_dim=16,
        num_kv_heads=2,
        causal=True,
        rotary=True,
        rotary_base=500.0,
        use_bias=True,
        context_attention="ulysses",
        sequence_axis="context",
        batch_axis="batch",
        balance="zigzag",
        ring_block_size=128,
        kernel_initializer="he_normal",
        bias_initializer="ones",
        qk_norm=True,
        qk_norm_epsilon=1e-5,
    )
    config = MultiHeadAttention(**kwargs).get_config()
    assert {k: config[k] for k in kwargs if "initializer" not in k} == {
        k: v for k, v in kwargs.items() if "initializer" not in k
    }
    assert config["kernel_initializer"]["class_name"] == "HeNormal"
    assert MultiHeadAttention(num_heads=4, head_dim=8).get_config()["num_kv_heads"] == 4


def test_plain_layer_is_reference_attention_between_projections():
    """Not vacuous: the layer's numbers are the reference kernel's, with masking and GQA."""
    layer = a.make_layer(num_kv_heads=2, causal=True)
    x, mask, _ = a.inputs(True)
    wq, wk, wv, wo = layer.get_weights()
    q, k, v = (np.einsum("btc,chd->bthd", x, w) for w in (wq, wk, wv))
    expected = np.einsum("bthd,hdc->btc", np.asarray(attention_reference(q, k, v, causal=True, key_mask=mask)), wo)
    np.testing.assert_allclose(np.asarray(layer(x, key_mask=mask)), expected, rtol=1e-5, atol=1e-5)


def _call(options, mesh, x=None, mask=None):
    x = a.inputs(False)[0] if x is None else x
    keras.distribution.set_distribution(None if mesh is None else a.distribution(mesh))
    return MultiHeadAttention(**({"num_heads": 4, "head_dim": 8} | options))(x, key_mask=mask)


@pytest.mark.parametrize(
    "options, mesh, x_shape, message",
    [
        (
            {"context_attention": "ring"},
            "data=2,seq=4",
            (2, 30, C),
            "sequence length 30 is not divisible by the 'seq' mesh axis of size 4",
        ),
        (
            {"context_attention": "ring", "balance": "zigzag"},
            "data=2,seq=4",
            (2, 36, C),
            r"sequence length 36 is not divisible by 2 x the 'seq' mesh axis of size 4 = 8",
        ),
        (
            {"balance": "striped"},
            "data=2,seq=4",
            (2, 30, C),
            "sequence length 30 is not divisible by the 'seq' mesh axis of size 4",
        ),
        (
            {"context_attention": "ulysses", "num_heads": 6, "num_kv_heads": 2},
            "data=2,seq=4",
            (2, 32, C),
            "number of heads 6 is not divisible by the 'seq' mesh axis of size 4",
        ),
        (
            {"context_attention": "gather"},
            "data=2,seq=4",
            (3, 32, C),
            "batch size 3 is not divisible by the 'data' mesh axis of size 2",
        ),
        (
            {"batch_axis": "rows"},
            "data=2,seq=4",
            (2, 32, C),
            r"batch_axis='rows' conflicts with the distribution's batch_dim_name='data'",
        ),
    ],
    ids=["seq", "seq-zigzag", "seq-plain-balanced", "ulysses-heads", "batch", "batch-axis"],
)
def test_errors_name_the_numbers(options, mesh, x_shape, message):
    with pytest.raises(ValueError, match=message):
        _call(options, mesh, np.zeros(x_shape, "float32"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=8, head_dim=4, num_kv_heads=3), "num_kv_heads 3 does not divide num_heads 8"),
        (
            dict(num_heads=4, head_dim=4, context_attention="flash"),
            r"context_attention must be one of \(None, 'gather', 'ring', 'ulysses'\), got 'flash'",
        ),
        (dict(num_heads=4, head_dim=4, balance="spiral"), "balance must be one of .* got 'spiral'"),
        (dict(num_heads=4, head_dim=5, rotary=True), "rotary embedding needs an even head_dim, got head_dim 5"),
        (dict(num_heads=0, head_dim=4), "num_heads must be a positive integer, got 0"),
        (dict(num_heads=4, head_dim=4, ring_block_size=0), "ring_block_size must be a positive integer, got 0"),
    ],
)
def test_bad_config_is_rejected_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_key_mask_shape_is_checked():
    with pytest.raises(ValueError, match=r"key_mask shape \(2, 31\) must be \(batch, length\) = \(2, 32\)"):
        _call({}, None, mask=np.ones((2, 31), bool))


def test_inputs_must_be_rank_3():
    with pytest.raises(ValueError, match=r"expects inputs \(batch, length, channels\).*\(2, 32\)"):
        MultiHeadAttention(num_heads=2, head_dim=4).build((2, 32))


def test_a_sliding_window_is_reference_attention_with_the_window_and_round_trips():
    layer = a.make_layer(num_kv_heads=2, causal=True, sliding_window=5)
    assert MultiHeadAttention.from_config(layer.get_config()).sliding_window == 5
    x, mask, _ = a.inputs(True)
    wq, wk, wv, wo = layer.get_weights()
    q, k, v = (np.einsum("btc,chd->bthd", x, w) for w in (wq, wk, wv))
    windowed = attention_reference(q, k, v, causal=True, key_mask=mask, sliding_window=5)
    expected = np.einsum("bthd,hdc->btc", np.asarray(windowed), wo)
    np.testing.assert_allclose(np.asarray(layer(x, key_mask=mask)), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="sliding_window=5 needs causal=True"):
        MultiHeadAttention(num_heads=4, head_dim=8, sliding_window=5)


@pytest.mark.parametrize(
    "options, mesh",
    [({}, "data=2,model=4"), ({"context_attention": "ulysses"}, "data=2,seq=4")],
    ids=["tensor-parallel", "ulysses"],
)
def test_a_sliding_window_matches_one_device_when_split(options, mesh):
    """Output and gradients of a windowed layer (W = 6 < T = 32, padding mask) split over
    heads (Megatron) or the sequence (Ulysses) equal the single-device layer's."""
    layer_options = {"causal": True, "rotary": True, "sliding_window": 6} | options
    weights = a.reference_weights(layer_options)
    x, mask, cotangent = a.inputs(True)
    expected = a.output_and_grads(layer_options, weights, x, mask, cotangent)
    a.assert_same(a.output_and_grads(layer_options, weights, x, mask, cotangent, a.distribution(mesh)), expected)
