"""A GPT trains through the TPU's attention kernel (splash, JAX's Pallas kernel) to the
numbers of the tiled kernel: the layers' path to it (q, k, v laid out per KV head, the
scale, the named residuals under remat) checked here, where the same Pallas program runs
in Pallas' interpreter (``PLATFORMS`` widened to this CPU for the test).

The smallest shapes splash takes: T = 128 (one block), head dim 64; grouped-query heads (2 of 1 KV head).
"""

import importlib

import keras
import numpy as np

from zoo.distribution import parity
from zoo.layers._sequence_parallel import describe_attention
from zoo.models import GPTBackbone, GPTCausalLM

CONFIG = dict(
    vocabulary_size=64,
    num_layers=1,
    num_query_heads=2,
    num_key_value_heads=1,
    hidden_dim=64,
    head_dim=64,
    intermediate_dim=64,
    max_sequence_length=128,
)
T, BATCH, STEPS = 128, 2, 2
kernels_module = importlib.import_module("zoo.kernels.splash_attention")  # the package exports a function of that name


def _data():
    batch = np.random.default_rng(0).integers(0, CONFIG["vocabulary_size"], (BATCH, T + 1), np.int32)
    tokens = np.concatenate([batch] * STEPS)  # the same batch each step: its loss must fall
    return tokens[:, :-1], tokens[:, 1:]


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )


def _run(remat):
    build = lambda: GPTCausalLM(backbone=GPTBackbone(**CONFIG, remat=remat))  # noqa: E731
    return parity.reference_run(build, _compile, *_data(), steps=STEPS, batch_size=BATCH)


def test_fit_through_splash_under_remat_equals_the_tiled_kernel(monkeypatch):
    """Under remat save_attention: splash's named residuals are what the backward pass keeps."""
    remat = "save_attention"
    tiled = _run(remat)
    monkeypatch.setattr(kernels_module, "PLATFORMS", ("tpu", "cpu"))
    assert describe_attention(seq_len=T, head_dim=64, causal=True) == "splash (blocks 128)"
    splashed = _run(remat)
    report = parity.compare_runs(tiled, splashed, rtol=1e-5, atol=1e-5)
    assert report.passed, "\n".join(report.format())
    losses = list(tiled.loss.values())
    assert losses[-1] < losses[0]  # not vacuous: it trained


def test_a_padded_encoder_trains_through_splash_to_the_tiled_kernels_numbers(monkeypatch):
    """Non-causal attention with key padding (an encoder's padded batch: each row's tail is
    pad_id) runs splash, not the tiles, and stays non-causal: the same numbers as the tiled
    kernel, outputs, gradients and weights over 2 steps of fit."""
    from zoo.models import TransformerEncoderClassifier

    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 64, (2 * BATCH, T), np.int32)
    tokens[:, 100:] = 0  # pad_id: 28 padded keys a row
    tokens[1::2, 60:] = 0  # and 68 in every other row
    labels = rng.integers(0, 3, (2 * BATCH,), np.int32)
    build = lambda: TransformerEncoderClassifier(  # noqa: E731
        vocabulary_size=64, num_classes=3, num_layers=1, num_query_heads=2, num_key_value_heads=1, hidden_dim=128,
        intermediate_dim=64, max_sequence_length=T,
    )  # fmt: skip

    def run():
        return parity.reference_run(build, _compile, tokens, labels, steps=STEPS, batch_size=BATCH)

    tiled = run()
    monkeypatch.setattr(kernels_module, "PLATFORMS", ("tpu", "cpu"))
    assert describe_attention(seq_len=T, head_dim=64, masked=True) == "splash (blocks 128)"
    splashed = run()
    report = parity.compare_runs(tiled, splashed, rtol=1e-5, atol=1e-5)
    assert report.passed, "\n".join(report.format())
