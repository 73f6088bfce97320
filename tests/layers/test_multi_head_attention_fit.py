"""``model.fit`` with sequence-parallel attention trains to the single-device numbers.

A tiny functional language model (Embedding -> MultiHeadAttention with a padding mask
from token 0 -> Dense head over the vocabulary, per-token cross-entropy) is trained for
3 SGD steps on one device and under ``CheckedModelParallel`` on a mesh with a ``seq``
axis; ``check_parity`` compares per-step losses, first-batch gradients (its own
``jax.jit`` of ``stateless_call``), predictions and final weights. Keras splits the
batch over ``data``; the layer's ``shard_map`` splits the sequence over ``seq``.
"""

import keras
import numpy as np
import pytest

from tests.layers import _attention as a
from zoo.distribution.parity import StepLosses, check_parity, compare
from zoo.kernels import reorder, restore
from zoo.layers import MultiHeadAttention

VOCAB, LENGTH, WIDTH, STEPS = 16, 32, 16, 3


def _tokens(count=48, seed=0):
    """(tokens i32[N, T], labels i32[N, T]): label = previous token; token 0 = right padding."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=(count, LENGTH)).astype("int32")
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, size=count)
    tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    labels = np.roll(tokens, 1, axis=1)
    labels[:, 0] = 0
    return tokens, labels


def _builder(**attention):
    def build():
        tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")  # (B, T)
        key_mask = keras.ops.not_equal(tokens, 0)  # bool (B, T)
        x = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(tokens)  # (B, T, C)
        options = dict(num_heads=4, head_dim=8, num_kv_heads=2, ring_block_size=a.BLOCK, name="attention") | attention
        x = MultiHeadAttention(**options)(x, key_mask=key_mask)  # (B, T, C)
        logits = keras.layers.Dense(VOCAB, name="head")(x)  # (B, T, V)
        return keras.Model(tokens, logits)

    return build


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


@pytest.mark.parametrize(
    "strategy, mesh, causal",
    [("ring", "data=2,seq=4", True), ("gather", "data=1,seq=4", False), ("ulysses", "data=2,seq=4", True)],
)
def test_fit_matches_one_device(strategy, mesh, causal):
    tokens, labels = _tokens()
    build = _builder(context_attention=strategy, causal=causal, rotary=True)
    report = check_parity(build, _compile, a.distribution(mesh), tokens, labels, steps=STEPS, batch_size=8)
    assert report.passed, "\n".join(report.format())
    assert len(report.distributed_losses) == STEPS
    assert report.reference_losses[0] != report.reference_losses[-1]  # training moved


def _train(build, dist, tokens, labels, initial):
    keras.distribution.set_distribution(dist)
    try:
        model = build()
        _compile(model)
        model.set_weights(initial)
        steps = StepLosses()
        model.fit(tokens, labels, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[steps])
        logits = model.predict(tokens[:8], batch_size=8, verbose=0)
        return steps.losses, {v.path: np.asarray(v.numpy()) for v in model.weights}, logits
    finally:
        keras.distribution.set_distribution(None)


def test_fit_on_zigzag_ordered_data_matches_one_device_on_natural_order():
    """Load-balanced ring: the pipeline reorders tokens and labels, the model never sees it.

    Per-token loss is a mean over tokens, so it is unchanged by the permutation; causality
    and RoPE follow the global positions the layer derives from the zig-zag order.
    """
    tokens, labels = _tokens(count=8 * STEPS)
    build = _builder(context_attention="ring", causal=True, rotary=True, balance="zigzag")
    keras.utils.set_random_seed(0)
    initial = build().get_weights()
    ref_losses, ref_weights, ref_logits = _train(build, None, tokens, labels, initial)
    moved = [reorder(t, num_shards=4, axis=1, balance="zigzag") for t in (tokens, labels)]
    losses, weights, logits = _train(build, a.distribution("data=2,seq=4"), *moved, initial)
    # without balance="zigzag" the layer reads wrong positions: the first loss moves by ~4e-5
    # relative; rounding moves it by < 1e-6
    np.testing.assert_allclose(losses, ref_losses, rtol=5e-6)
    assert compare(ref_weights, weights).within_tolerance, compare(ref_weights, weights)
    restored = restore(logits, num_shards=4, axis=1, balance="zigzag")
    np.testing.assert_allclose(restored, ref_logits, rtol=1e-4, atol=1e-4)
