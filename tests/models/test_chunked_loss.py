"""The loss in chunks (``GPTCausalLM(loss_chunk_size=t)``, ``_chunked_loss``) against the
plain ``SparseCategoricalCrossentropy(from_logits=True)`` on whole logits: forward and
gradients, masking, padding, tied and untied heads, the soft-cap, the ``tp`` layout, and
the compiled step's temporaries."""

import re

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from zoo import distribution as zd
from zoo.measure.comms_report import compiled_report
from zoo.measure.compiled_step import compile_fit_step
from zoo.models.gpt import GPTCausalLM
from zoo.models.gpt._chunked_loss import chunked_cross_entropy
from zoo.training.lm_finetune import compile_causal_lm

MEAN = "mean_with_sample_weight"


def _plain(hidden, kernel, labels, weights, reduction, softcap=None):
    logits = (hidden @ kernel).astype("float32")
    if softcap:
        logits = softcap * jnp.tanh(logits / softcap)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)(labels, logits, weights)


@pytest.mark.parametrize(
    "reduction, weighted, softcap",
    [(MEAN, True, 3.0), ("sum_over_batch_size", True, None), (MEAN, False, None), ("sum", True, None)],
)
def test_the_function_equals_the_plain_loss_and_its_gradients(reduction, weighted, softcap):
    """T = 10 in chunks of 4 (two padded positions), weights with zeros."""
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(2, 10, 8)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 16, size=(2, 10)), jnp.int32)
    weights = jnp.asarray(rng.integers(0, 2, size=(2, 10)), jnp.float32) if weighted else None

    def chunked(h, k):
        head = (lambda x: x @ k) if softcap is None else (lambda x: softcap * jnp.tanh((x @ k) / softcap))
        return chunked_cross_entropy(h, head, labels, weights, chunk_tokens=4, reduction=reduction)

    value, grads = jax.value_and_grad(chunked, argnums=(0, 1))(hidden, kernel)
    expected, expected_grads = jax.value_and_grad(
        lambda h, k: _plain(h, k, labels, weights, reduction, softcap), argnums=(0, 1)
    )(hidden, kernel)
    np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-6)
    for grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)
    if weighted:  # all weights zero: 0, as Keras' divide_no_nan gives
        assert (
            float(
                chunked_cross_entropy(
                    hidden, lambda x: x @ kernel, labels, jnp.zeros((2, 10)), chunk_tokens=4, reduction=reduction
                )
            )
            == 0.0
        )


def _pair(chunk, **overrides):
    """A plain and a chunked ``GPTCausalLM`` of the same weights, compiled alike
    (``compile_causal_lm``: the fine-tuning loss, with SGD)."""
    keras.utils.set_random_seed(0)  # the same weights every run: a failure reproduces
    plain = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1, **overrides)
    chunked = GPTCausalLM.from_config(plain.get_config())
    chunked.set_weights(plain.get_weights())
    compile_causal_lm(plain, keras.optimizers.SGD(1.0))
    compile_causal_lm(chunked, keras.optimizers.SGD(1.0), loss_chunk_size=chunk)
    return plain, chunked


def _batch(batch=2, length=7, vocabulary=256):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, vocabulary, size=(batch, length + 1)).astype("int32")
    weights = (rng.random((batch, length)) > 0.3).astype("float32")
    return tokens[:, :-1], tokens[:, 1:], weights


def _check_step(plain, chunked, batch, evaluate=False):
    """One ``train_on_batch`` (and with ``evaluate`` a ``test_on_batch`` and ``predict``)
    of each: the same loss, the same update."""
    x, y, w = batch
    if evaluate:
        np.testing.assert_allclose(
            chunked.test_on_batch(x, y, sample_weight=w), plain.test_on_batch(x, y, sample_weight=w), rtol=1e-5
        )
    before = [np.asarray(v) for v in plain.get_weights()]
    losses = [model.train_on_batch(x, y, sample_weight=w) for model in (plain, chunked)]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for start, a, b in zip(before, plain.get_weights(), chunked.get_weights()):  # SGD(1): the update is the gradient
        np.testing.assert_allclose(b - start, a - start, rtol=1e-4, atol=1e-6)
    if evaluate:  # predict still gives the whole logits, of weights updated within the tolerance above
        np.testing.assert_allclose(chunked.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-4, atol=1e-6)


def test_fit_evaluate_and_predict_tied_softcapped_moe():
    """T = 7 in chunks of 3 (two padded positions), sample weights with zeros, a tied
    embedding, the final soft-cap, and a Mixture-of-Experts block whose router adds a
    load-balancing loss in training (0.5 x about 1: the two steps' losses differ unless
    the chunked one adds it); predict still gives logits. The untied head: the tp test."""
    plain, chunked = _pair(
        3,
        tie_word_embeddings=True,
        final_logit_softcap=5.0,
        num_experts=4,
        num_experts_per_token=2,
        router_aux_loss_coefficient=0.5,
    )
    _check_step(plain, chunked, _batch(), evaluate=True)


def test_the_setting_round_trips_and_wrong_uses_are_refused():
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1, loss_chunk_size=16)
    assert GPTCausalLM.from_config(model.get_config()).loss_chunk_size == 16
    with pytest.raises(ValueError, match="loss_chunk_size must be a positive number of tokens or None, got 0"):
        GPTCausalLM.from_config({**model.get_config(), "loss_chunk_size": 0})
    with pytest.raises(ValueError, match="got 2.5"):
        model.loss_chunk_size = 2.5
    x, y, _ = _batch()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy())  # probabilities, not logits
    with pytest.raises(ValueError, match="from_logits=True"):
        model.train_on_batch(x, y)
    model.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    with pytest.raises(ValueError, match="compiled metrics"):
        model.train_on_batch(x, y)


def test_pre_training_takes_the_setting_from_its_flag_and_recipe_key():
    """zoo train gpt --loss-chunk-size / [train] loss_chunk_size reach the model through
    compile_gpt (the job's and the recipe's compile); zoo plan takes the same flag."""
    from zoo.cli.main import build_parser
    from zoo.config import schema
    from zoo.config.settings import GPTTrainSettings
    from zoo.training.gpt import compile_gpt

    args = build_parser().parse_args(["train", "gpt", "--loss-chunk-size", "8"])
    assert schema.from_args(GPTTrainSettings, args).loss_chunk_size == 8
    assert build_parser().parse_args(["plan", "--loss-chunk-size", "8"]).loss_chunk_size == 8
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1)
    compile_gpt(model, 1e-3, 10, loss_chunk_size=8)
    assert model.loss_chunk_size == 8


@pytest.mark.parametrize("layout", ["tp", "fsdp+tp"])
def test_vocabulary_parallel_under_tp_equals_the_plain_loss_and_gathers_no_logits(layout):
    """tp and fsdp+tp on data=2,model=4: the head split over V (and over data on C under
    fsdp+tp); the chunked step equals the plain one and its compiled HLO holds no
    all-gather of (B, t, V) logits."""
    distribution = zd.distribution_for(
        GPTCausalLM,
        layout,
        zd.make_mesh("data=2,model=4"),
        config=GPTCausalLM.from_config_name("gpt_tiny").get_config(),
    )
    try:
        plain, chunked = zd.build_distributed(lambda: _pair(4), distribution)
        _check_step(plain, chunked, _batch(batch=4, length=8))
        compiled, _ = compile_fit_step(chunked, distribution, ((4, 8), "int32"), ((4, 8), "int32"))
    finally:
        keras.distribution.set_distribution(None)
    text = compiled.as_text()
    assert "f32[2,4,64]" in text  # a chunk's logits on one device: (B/2, t, V/4)
    whole = sorted(set(re.findall(r"f32\[[0-9,]*,256\]", text)))  # any buffer of all V logits
    assert not whole, whole
    if layout == "tp":
        assert " all-gather(" not in text
    # nothing is reduced over data inside a loop: the head's gradient and the loss once per
    # step, not once per chunk (2 chunks here: the loss runs manual over data,
    # zoo.layers.batch_rows; before, both ran in each chunk's iteration)
    report = compiled_report(compiled, zd.make_mesh("data=2,model=4").backend_mesh, hlo_text=text)
    reductions = [
        op for op in report.collectives if op.axes == ("data",) and op.kind in ("all-reduce", "reduce-scatter")
    ]
    assert reductions and all(op.executions == 1 for op in reductions), [(op.shape, op.executions) for op in reductions]


def test_the_compiled_step_holds_no_whole_logits():
    """B = 2, T = 512, V = 8,192: each (B, T, V) float32 buffer is 32 MiB; in chunks of 64
    the step's temporaries fall by more than two of them (the logits, their log-softmax and
    gradient: three, of which XLA:CPU's schedule without its concurrency-optimized scheduler,
    the suite's, keeps two alive at once)."""
    sizes = dict(num_layers=1, vocabulary_size=8192, max_sequence_length=512)
    temps = []
    for chunk in (None, 64):
        keras.backend.clear_session(free_memory=False)  # names only: no full gc.collect()
        model = GPTCausalLM.from_config_name("gpt_tiny", loss_chunk_size=chunk, **sizes)
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        temps.append(compile_fit_step(model, None, ((2, 512), "int32"), ((2, 512), "int32"))[1].temp)
    logits = 2 * 512 * 8192 * 4
    # measured: 107.6 -> 28.8 MiB (141 -> 34 MiB with the concurrency-optimized scheduler)
    assert temps[0] - temps[1] > 2 * logits, (temps, logits)
