"""KV-cache generation: cached decoding equals full recomputation; samplers are seeded,
stay inside their top-k / nucleus set, and degenerate to greedy; errors name numbers."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from zoo.layers import MultiHeadAttention
from zoo.models.gpt import GPTCausalLM
from zoo.models.gpt import _sampling

PROMPT, NEW = 5, 7


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    return GPTCausalLM.from_config_name("gpt_tiny", max_sequence_length=16)


@pytest.fixture(scope="module")
def prompts():
    return np.random.default_rng(1).integers(0, 256, size=(2, PROMPT)).astype("int32")


def _greedy_by_recomputation(model, prompts, steps):
    """Argmax of a full forward pass over the sequence so far, once per new token.

    The sequence is zero-padded to its final length so one compiled forward serves
    every step; causality makes position t independent of the padding after it.
    """
    batch, length = prompts.shape
    tokens = np.zeros((batch, length + steps), "int32")
    tokens[:, :length] = prompts
    for position in range(length, length + steps):
        logits = np.asarray(model.predict_on_batch(tokens))  # (B, P + N, V)
        tokens[:, position] = logits[:, position - 1].argmax(-1)
    return tokens


def test_greedy_cached_generation_equals_full_recomputation(model, prompts):
    generated = model.generate(prompts, NEW)
    assert generated.shape == (2, PROMPT + NEW) and generated.dtype == np.int32
    np.testing.assert_array_equal(generated[:, :PROMPT], prompts)
    np.testing.assert_array_equal(generated, _greedy_by_recomputation(model, prompts, NEW))
    assert len(set(generated[0, PROMPT:])) > 1  # not a constant stream


def test_tied_layernorm_model_from_one_token_prompts():
    keras.utils.set_random_seed(4)
    model = GPTCausalLM.from_config_name("gpt_tiny", tie_word_embeddings=True, mlp="gelu", norm="layer", num_layers=1, max_sequence_length=8)
    prompts = [[7], [200]]  # a list of equal-length lists, P = 1
    generated = model.generate(prompts, 4)
    np.testing.assert_array_equal(generated, _greedy_by_recomputation(model, np.array(prompts, "int32"), 4))


def test_samplers_are_seeded_and_degenerate_to_greedy(model, prompts):
    greedy = model.generate(prompts, NEW)
    top_k = model.generate(prompts, NEW, sampler="top_k", top_k=50, temperature=2.0, seed=1)
    np.testing.assert_array_equal(model.generate(prompts, NEW, sampler="top_k", top_k=50, temperature=2.0, seed=1), top_k)
    assert not np.array_equal(model.generate(prompts, NEW, sampler="top_k", top_k=50, temperature=2.0, seed=2), top_k)
    np.testing.assert_array_equal(model.generate(prompts, NEW, sampler="top_k", top_k=1, seed=5), greedy)

    top_p = model.generate(prompts, NEW, sampler="top_p", top_p=0.9, temperature=2.0, seed=1)
    np.testing.assert_array_equal(model.generate(prompts, NEW, sampler="top_p", top_p=0.9, temperature=2.0, seed=1), top_p)
    assert not np.array_equal(model.generate(prompts, NEW, sampler="top_p", top_p=0.9, temperature=2.0, seed=2), top_p)
    np.testing.assert_array_equal(model.generate(prompts, NEW, sampler="top_p", top_p=1e-6, seed=5), greedy)


def test_top_k_and_top_p_sample_only_inside_their_sets():
    logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))  # likeliest: 1 (0.5), 3 (0.3), 2 (0.15), 0
    keys = jax.random.split(jax.random.key(0), 400)

    def draws(**settings):
        chosen = jax.vmap(lambda key: _sampling.sample(logits, key, **settings))(keys)  # i32[400, 1]
        return np.bincount(np.asarray(chosen).ravel(), minlength=4)

    assert set(np.flatnonzero(draws(sampler="top_k", top_k=2))) == {1, 3}
    assert set(np.flatnonzero(draws(sampler="top_p", top_p=0.7))) == {1, 3}  # 0.5 < 0.7 <= 0.8
    assert set(np.flatnonzero(draws(sampler="top_p", top_p=0.85))) == {1, 2, 3}
    counts = draws(sampler="top_k", top_k=4)
    assert set(np.flatnonzero(counts)) == {0, 1, 2, 3} and counts[1] > counts[3] > counts[2] > counts[0]


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(prompts=np.zeros((2, 10), "int32"), max_new_tokens=7), "prompt length 10 + max_new_tokens 7 = 17 exceeds max_sequence_length 16"),
        (dict(prompts=[[1, 2], [3, 4, 5]], max_new_tokens=2), "prompts must all have the same length, got lengths [2, 3]"),
        (dict(prompts=[[1, 256]], max_new_tokens=2), "prompt token ids must be in [0, vocabulary size 256), got range [1, 256]"),
        (dict(prompts=[[1, 2]], max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
        (dict(prompts=[[1, 2]], max_new_tokens=2, sampler="beam"), "sampler must be one of ['greedy', 'top_k', 'top_p'], got 'beam'"),
        (dict(prompts=[[1, 2]], max_new_tokens=2, sampler="top_k"), "needs an integer top_k in [1, vocabulary size 256], got None"),
        (dict(prompts=[[1, 2]], max_new_tokens=2, sampler="top_p", top_p=1.5), "needs top_p in (0, 1], got 1.5"),
        (dict(prompts=[[1, 2]], max_new_tokens=2, temperature=0.0), "temperature must be > 0, got 0.0"),
    ],
)
def test_generate_errors_name_the_numbers(model, call, message):
    with pytest.raises(ValueError) as error:
        model.generate(**call)
    assert message in str(error.value)


# --- the layers' cached call path ---------------------------------------------------------


def test_cached_attention_calls_equal_one_full_call():
    """Prefill 3 tokens, then 1, then 2 into a cache of 8: the same as one causal call."""
    layer = MultiHeadAttention(num_heads=4, head_dim=8, num_kv_heads=2, causal=True, rotary=True)  # gpt_tiny's
    x = np.random.default_rng(0).standard_normal((2, 6, 32)).astype("float32")
    layer.build(x.shape)  # variables exist before jit captures them
    full = np.asarray(jax.jit(layer)(x))

    @jax.jit
    def cached(x):
        cache, outputs = layer.empty_cache(2, 8), []
        for start, stop in ((0, 3), (3, 4), (4, 6)):
            out, cache = layer(x[:, start:stop], cache=cache, cache_index=jnp.int32(start))
            outputs.append(out)
        return jnp.concatenate(outputs, axis=1), cache

    out, cache = cached(x)
    np.testing.assert_allclose(np.asarray(out), full, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(cache)[:, :, 6:] == 0) and np.all(np.asarray(cache)[:, :, 5] != 0)
    with pytest.raises(ValueError, match=r"cache shape \(2, 2, 8, 4, 8\) must be .* = \(2, 2, S, 2, 8\)"):
        layer(x[:, :1], cache=jnp.zeros((2, 2, 8, 4, 8)))  # 4 KV heads in the cache, the layer has 2
