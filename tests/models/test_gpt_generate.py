"""KV-cache generation: cached decoding equals full recomputation, also for prompts of
different lengths in one batch; stop tokens end rows and the loop; streaming gives the
tokens it returns; text in, text out through a preprocessor; samplers are seeded, stay
inside their top-k / nucleus set, and degenerate to greedy; errors name numbers.

Compiles are the cost: every generate call here uses (B, P, N) = (2, 5, 7), streaming or
not, except the one-token-prompt model's own."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from zoo.layers import MultiHeadAttention
from zoo.models.gpt import GPTCausalLM, GPTCausalLMPreprocessor, _sampling
from zoo.tokenizers import ByteTokenizer

PROMPT, NEW = 5, 7


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    return GPTCausalLM.from_config_name("gpt_tiny", max_sequence_length=16)


@pytest.fixture(scope="module")
def prompts():
    return np.random.default_rng(1).integers(0, 256, size=(2, PROMPT)).astype("int32")


def _greedy_by_recomputation(model, prompts, steps):
    """Each prompt alone extended by ``steps`` argmax tokens of a full forward pass over
    its sequence so far (no cache, no padding before it): rows of one int32 array when the
    prompts share a length, else a list of arrays.

    Each sequence sits at the start of a zero-padded row of width max length + steps, so
    one compiled forward serves every step; causality makes position t independent of
    the padding after it.
    """
    lengths = [len(prompt) for prompt in prompts]
    tokens = np.zeros((len(prompts), max(lengths) + steps), "int32")
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    for step in range(steps):
        logits = np.asarray(model.predict_on_batch(tokens))  # (B, W, V)
        for row, length in enumerate(lengths):
            tokens[row, length + step] = logits[row, length + step - 1].argmax(-1)
    rows = [tokens[row, : length + steps] for row, length in enumerate(lengths)]
    return np.stack(rows) if len(set(lengths)) == 1 else rows


def test_greedy_cached_generation_equals_full_recomputation(model, prompts):
    generated = model.generate(prompts, NEW)
    assert generated.shape == (2, PROMPT + NEW) and generated.dtype == np.int32
    np.testing.assert_array_equal(generated[:, :PROMPT], prompts)
    np.testing.assert_array_equal(generated, _greedy_by_recomputation(model, prompts, NEW))
    assert len(set(generated[0, PROMPT:])) > 1  # not a constant stream


def test_tied_layernorm_model_from_one_token_prompts():
    keras.utils.set_random_seed(4)
    model = GPTCausalLM.from_config_name(
        "gpt_tiny", tie_word_embeddings=True, mlp="gelu", norm="layer", num_layers=1, max_sequence_length=8
    )
    prompts = [[7], [200]]  # a list of equal-length lists, P = 1
    generated = model.generate(prompts, 4)
    np.testing.assert_array_equal(generated, _greedy_by_recomputation(model, np.array(prompts, "int32"), 4))


# --- real use: prompts of different lengths, stop tokens, streaming, text ----------------


def _new_tokens_until_stop(generated_row, stops):
    """How many new tokens a row keeps when ``stops`` end it: up to its first stop token, included."""
    hits = [step for step, token in enumerate(generated_row[PROMPT:]) if token in stops]
    return hits[0] + 1 if hits else NEW


def test_prompts_of_different_lengths_generate_as_each_alone(model, prompts):
    """Left-padded to the longest (5) and decoded together, each row gets the tokens of its
    prompt alone (unpadded, uncached), whichever row holds the padding."""
    short = prompts[1, :3]
    for batch in ([prompts[0], short], [short, prompts[0]]):
        generated, mask = model.generate(batch, NEW, return_padding_mask=True)  # (2, 12): the (2, 5, 7) program
        for row, alone in enumerate(_greedy_by_recomputation(model, batch, NEW)):
            np.testing.assert_array_equal(generated[row][mask[row]], alone)
            assert mask[row, PROMPT + NEW - len(alone) :].all() and not mask[row, : PROMPT + NEW - len(alone)].any()
    np.testing.assert_array_equal(generated[0, :2], [0, 0])  # the pad id (no preprocessor: 0)


def test_a_stop_token_ends_its_row(model, prompts):
    greedy = model.generate(prompts, NEW)
    stop = int(greedy[0, PROMPT + 2])  # row 0's third new token
    generated, mask = model.generate(prompts, NEW, stop_token_ids=(stop,), return_padding_mask=True)
    kept = [_new_tokens_until_stop(greedy[row], {stop}) for row in range(2)]
    assert kept[0] <= 3 and (greedy[0, PROMPT + kept[0] :] != 0).any()  # row 0 stops early; unstopped it goes on
    for row, new in enumerate(kept):
        np.testing.assert_array_equal(generated[row, : PROMPT + new], greedy[row, : PROMPT + new])  # stop token kept
        assert (generated[row, PROMPT + new :] == 0).all() and mask[row].sum() == PROMPT + new  # pad id after it


def test_streaming_gives_the_returned_tokens_and_the_loop_ends_when_every_row_stopped(model, prompts):
    batch = [prompts[0], prompts[1, :3]]
    steps = []
    generated = model.generate(batch, NEW, stream=steps.append)  # the streaming (2, 5, 7) program
    assert len(steps) == NEW and all(len(ids) == 1 for step in steps for ids in step)
    np.testing.assert_array_equal(np.array(steps)[:, :, 0].T, generated[:, PROMPT:])
    np.testing.assert_array_equal(model.generate(batch, NEW), generated)

    stops = {int(generated[0, PROMPT + 2]), int(generated[1, PROMPT + 1])}
    kept = [_new_tokens_until_stop(generated[row], stops) for row in range(2)]
    steps = []
    stopped = model.generate(batch, NEW, stop_token_ids=tuple(stops), stream=steps.append)
    assert len(steps) == max(kept) <= 3  # no step after the last row stopped
    for row, new in enumerate(kept):
        assert [ids for step in steps for ids in step[row]] == generated[row, PROMPT : PROMPT + new].tolist()
        assert all(step[row] == [] for step in steps[new:])
        np.testing.assert_array_equal(stopped[row, : PROMPT + new], generated[row, : PROMPT + new])

    calls = []

    def broken(new_ids):
        calls.append(new_ids)
        raise KeyError("the terminal went away")

    with pytest.raises(KeyError, match="the terminal went away"):
        model.generate(batch, NEW, stream=broken)
    assert len(calls) == 1  # the loop stopped at the first error


def test_text_in_text_out_through_the_preprocessor(model, prompts, monkeypatch):
    tokenizer = ByteTokenizer()
    monkeypatch.setattr(model, "preprocessor", GPTCausalLMPreprocessor(tokenizer, sequence_length=16))
    texts = ["hello", "abc"]  # 5 and 3 bytes, no start token: the (2, 5, 7) programs
    ids = model.generate([list(text.encode()) for text in texts], NEW)
    pieces = []
    out = model.generate(texts, NEW, stream=pieces.append)
    for row, text in enumerate(texts):
        continuation = tokenizer.decode(ids[row, PROMPT:])
        assert out[row] == text + continuation  # prompt + continuation, as keras-hub returns it
        assert "".join(piece[row] for piece in pieces) == continuation

    tokenizer.stop_token_ids = (int(ids[0, PROMPT + 2]),)  # the tokenizer's stop ids are the default
    kept = _new_tokens_until_stop(ids[0], set(tokenizer.stop_token_ids))
    pieces = []
    out = model.generate(texts, NEW, stream=pieces.append)
    assert out[0] == "hello" + tokenizer.decode(ids[0, PROMPT : PROMPT + kept - 1])  # the stop token not shown
    for row, text in enumerate(texts):
        assert text + "".join(piece[row] for piece in pieces) == out[row]  # nor streamed


def test_samplers_are_seeded_and_degenerate_to_greedy(model, prompts):
    greedy = model.generate(prompts, NEW)
    top_k = model.generate(prompts, NEW, sampler="top_k", top_k=50, temperature=2.0, seed=1)
    np.testing.assert_array_equal(
        model.generate(prompts, NEW, sampler="top_k", top_k=50, temperature=2.0, seed=1), top_k
    )
    assert not np.array_equal(model.generate(prompts, NEW, sampler="top_k", top_k=50, temperature=2.0, seed=2), top_k)
    np.testing.assert_array_equal(model.generate(prompts, NEW, sampler="top_k", top_k=1, seed=5), greedy)

    top_p = model.generate(prompts, NEW, sampler="top_p", top_p=0.9, temperature=2.0, seed=1)
    np.testing.assert_array_equal(
        model.generate(prompts, NEW, sampler="top_p", top_p=0.9, temperature=2.0, seed=1), top_p
    )
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
        (
            dict(prompts=np.zeros((2, 10), "int32"), max_new_tokens=7),
            "prompt length 10 + max_new_tokens 7 = 17 exceeds max_sequence_length 16",
        ),
        (
            dict(prompts=[[1, 2], []], max_new_tokens=2),
            "prompt 1 must be a non-empty list of token ids, got shape (0,)",
        ),
        (
            dict(prompts=[[1, 256]], max_new_tokens=2),
            "prompt token ids must be in [0, vocabulary size 256), got range [1, 256] in prompt 0",
        ),
        (
            dict(prompts=[[1, 2]], max_new_tokens=2, stop_token_ids=(3, 300)),
            "stop_token_ids must be in [0, vocabulary size 256), got (3, 300)",
        ),
        (
            dict(prompts="def ", max_new_tokens=2),
            "prompts are text, but this GPTCausalLM has no preprocessor to tokenize them: attach one",
        ),
        (dict(prompts=[[1, 2]], max_new_tokens=2, stream="print"), "stream must be callable, got str"),
        (dict(prompts=[[1, 2]], max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
        (
            dict(prompts=[[1, 2]], max_new_tokens=2, sampler="beam"),
            "sampler must be one of ['greedy', 'top_k', 'top_p'], got 'beam'",
        ),
        (
            dict(prompts=[[1, 2]], max_new_tokens=2, sampler="top_k"),
            "needs an integer top_k in [1, vocabulary size 256], got None",
        ),
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


def test_a_windowed_layer_caches_the_window_alone():
    """sliding_window 3: a ring buffer of 3 slots. Prefill 4 tokens (longer than the
    window), then 1, 1, 2, 1 (wrapping the ring twice), row 1 left-padded by 2: each
    row's real positions equal one windowed call on that row alone."""
    layer = MultiHeadAttention(num_heads=4, head_dim=8, num_kv_heads=2, causal=True, rotary=True, sliding_window=3)
    x = np.random.default_rng(1).standard_normal((2, 9, 32)).astype("float32")
    layer.build(x.shape)
    alone = [np.asarray(layer(x[:1])), np.asarray(layer(x[1:, 2:]))]  # (1, 9, C), (1, 7, C)
    starts = jnp.array([0, 2], jnp.int32)

    @jax.jit
    def cached(x):
        cache, outputs = layer.empty_cache(2, 9), []
        for start, stop in ((0, 4), (4, 5), (5, 6), (6, 8), (8, 9)):
            out, cache = layer(x[:, start:stop], cache=cache, cache_index=jnp.int32(start), start_positions=starts)
            outputs.append(out)
        return jnp.concatenate(outputs, axis=1), cache

    out, cache = cached(x)
    assert cache.shape == (2, 2, 3, 2, 8)  # (B, 2, W, K, D), not the 9 positions
    np.testing.assert_allclose(np.asarray(out)[:1], alone[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out)[1:, 2:], alone[1], rtol=1e-5, atol=1e-5)
