"""MultiHeadAttention under a sequence-splitting distribution matches the plain layer.

For each strategy, on 8 devices (``data=2,seq=4`` and ``seq=8``) and on 4
(``data=1,seq=4`` on the first four): forward output and the gradients with respect to
the input and every weight equal the layer with no distribution, at float32
tolerance. Cases pair the factors (causal or not, MHA / GQA / MQA, padding mask,
rotary embedding, load balancing) rather than take their full product.
"""

import functools

import jax
import numpy as np
import pytest

from tests.layers import _attention as a
from zoo.kernels import reorder, restore

# (strategy, mesh, causal, heads, kv_heads, masked, rotary, balance)
CASES = [
    ("gather", "data=2,seq=4", True, 4, 2, True, True, None),
    ("gather", "data=1,seq=4", False, 4, 4, False, False, None),
    ("gather", "seq=8", True, 8, 8, True, True, "striped"),
    ("ring", "data=2,seq=4", True, 4, 4, True, False, None),
    ("ring", "data=1,seq=4", False, 4, 2, True, True, None),
    ("ring", "seq=8", True, 8, 2, True, True, None),
    ("ring", "data=2,seq=4", True, 4, 2, True, True, "zigzag"),
    ("ring", "data=1,seq=4", True, 4, 4, True, True, "striped"),
    ("ulysses", "data=2,seq=4", False, 4, 2, True, True, None),
    ("ulysses", "data=1,seq=4", True, 4, 4, False, False, None),
    ("ulysses", "seq=8", True, 8, 1, True, True, None),
    ("ulysses", "data=2,seq=4", True, 4, 2, True, True, "zigzag"),
    # no kernel: plain attention that GSPMD partitions, inputs in zig-zag order
    (None, "data=2,seq=4", True, 4, 2, True, True, "zigzag"),
]


def _case_id(case):
    strategy, mesh, causal, heads, kv_heads, masked, rotary, balance = case
    parts = [str(strategy), mesh.replace(",", "_"), "causal" if causal else "full", f"h{heads}k{kv_heads}"]
    parts += ["mask"] * masked + ["rope"] * rotary + [balance] * (balance is not None)
    return "-".join(parts)


def _options(case):
    strategy, _, causal, heads, kv_heads, _, rotary, balance = case
    return dict(
        num_heads=heads, num_kv_heads=kv_heads, causal=causal, rotary=rotary,
        sequence_parallel=strategy, balance=balance,
    )


@functools.lru_cache(maxsize=None)
def _reference(causal, heads, kv_heads, masked, rotary):
    options = dict(num_heads=heads, num_kv_heads=kv_heads, causal=causal, rotary=rotary)
    weights = a.reference_weights(options)
    x, mask, cotangent = a.inputs(masked)
    return weights, a.output_and_grads(options, weights, x, mask, cotangent)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_output_and_gradients_match_plain_layer(case):
    strategy, mesh, causal, heads, kv_heads, masked, rotary, balance = case
    weights, expected = _reference(causal, heads, kv_heads, masked, rotary)
    x, mask, cotangent = a.inputs(masked)
    n = a.mesh_size(mesh)
    move, back = (lambda t: t), (lambda t: t)
    if balance is not None:  # the data pipeline's job: reorder inputs, restore outputs
        move = functools.partial(reorder, num_shards=n, axis=1, balance=balance)
        back = functools.partial(restore, num_shards=n, axis=1, balance=balance)
    x, cotangent = move(x), move(cotangent)
    mask = None if mask is None else move(mask)
    out, dx, dw = a.output_and_grads(_options(case), weights, x, mask, cotangent, a.distribution(mesh))
    # weight gradients sum over tokens: the order of the tokens does not change them
    a.assert_same((back(out), back(dx), dw), expected)


def test_balance_changes_the_numbers_when_positions_matter():
    """Guards the test above against vacuity: zig-zag inputs read in natural order differ."""
    case = ("ring", "data=1,seq=4", True, 4, 4, True, True, "zigzag")
    weights, expected = _reference(True, 4, 4, True, True)
    x, mask, cotangent = a.inputs(True)
    x, mask, cotangent = (reorder(t, num_shards=4, axis=1) for t in (x, mask, cotangent))
    options = _options(case) | {"balance": None}
    out, _, _ = a.output_and_grads(options, weights, x, mask, cotangent, a.distribution("data=1,seq=4"))
    assert not np.allclose(restore(out, num_shards=4, axis=1), expected[0], rtol=1e-2, atol=1e-3)


def _jaxpr_text(options, dist, x):
    import keras

    keras.distribution.set_distribution(dist)
    try:
        layer = a.make_layer(**options)
        values = [v.value for v in layer.trainable_variables]
        return str(jax.make_jaxpr(lambda v, x: layer.stateless_call(v, [], x)[0])(values, x))
    finally:
        keras.distribution.set_distribution(None)


@pytest.mark.parametrize(
    "mesh, strategy",
    [("data=8", None), ("data=8,seq=1", "ring"), ("data=2,seq=4", None), (None, "ulysses")],
    ids=["no-seq-axis", "seq-size-1", "no-strategy", "no-distribution"],
)
def test_plain_path_gives_the_plain_numbers(mesh, strategy):
    """No distribution, no strategy, or a sequence axis of size 1: no shard_map, same numbers."""
    options = dict(causal=True, rotary=True, num_kv_heads=2)
    weights, expected = _reference(True, 4, 2, True, True)
    x, mask, cotangent = a.inputs(True)
    dist = None if mesh is None else a.distribution(mesh)
    assert "shard_map" not in _jaxpr_text(options | {"sequence_parallel": strategy}, dist, x)
    got = a.output_and_grads(options | {"sequence_parallel": strategy}, weights, x, mask, cotangent, dist)
    a.assert_same(got, expected)


def test_sharded_path_does_use_shard_map():
    text = _jaxpr_text({"sequence_parallel": "ring"}, a.distribution("data=2,seq=4"), a.inputs(False)[0])
    assert "shard_map" in text and "ppermute" in text
