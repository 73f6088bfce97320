"""KV-cache generation for ``GPTCausalLM``: a prefill pass, then a ``fori_loop`` of decode
steps, all under one ``jax.jit`` that takes the model's variables as arguments.

Letters: B batch, P prompt length, N new tokens, S = P + N cache length, V vocabulary.
"""

import weakref

import jax
import jax.numpy as jnp
import keras
import numpy as np

from zoo.models.gpt import _sampling

# model -> {static settings: jitted program}; dropped with the model.
_PROGRAMS = weakref.WeakKeyDictionary()


def as_prompts(prompts, vocabulary_size):
    """int32 (B, P) from an array or a list of equal-length lists, with ids checked."""
    try:
        array = np.asarray(prompts)
    except ValueError:
        array = None
    if array is None or array.dtype == object:
        lengths = sorted({len(row) for row in prompts})
        raise ValueError(f"prompts must all have the same length, got lengths {lengths}")
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"prompts must be (batch, prompt length >= 1) token ids, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"prompts must be integer token ids, got dtype {array.dtype}")
    if array.min() < 0 or array.max() >= vocabulary_size:
        raise ValueError(
            f"prompt token ids must be in [0, vocabulary size {vocabulary_size}), got range [{array.min()}, {array.max()}]"
        )
    return array.astype(np.int32)


def check_lengths(prompt_length, max_new_tokens, max_sequence_length):
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if prompt_length + max_new_tokens > max_sequence_length:
        raise ValueError(
            f"prompt length {prompt_length} + max_new_tokens {max_new_tokens} = "
            f"{prompt_length + max_new_tokens} exceeds max_sequence_length {max_sequence_length}"
        )


def generate(model, prompts, *, max_new_tokens, sampler, temperature, top_k, top_p, seed):
    """(B, P + N) int32: the prompts followed by N sampled tokens (see ``GPTCausalLM.generate``)."""
    batch, prompt_length = prompts.shape
    program = _program(model, batch, prompt_length, max_new_tokens, sampler)
    seed = np.random.randint(2**31 - 1) if seed is None else seed
    values = [variable.value for variable in model.variables]
    settings = dict(temperature=jnp.float32(temperature), top_k=jnp.int32(top_k or 1), top_p=jnp.float32(top_p or 1.0))
    return np.asarray(program(values, jnp.asarray(prompts), jax.random.key(seed), settings))


def _program(model, batch, prompt_length, max_new_tokens, sampler):
    """The jitted program for these static settings (compiled once, then reused)."""
    settings = (batch, prompt_length, max_new_tokens, sampler)
    programs = _PROGRAMS.setdefault(model, {})
    if settings not in programs:
        programs[settings] = jax.jit(_decode_fn(model, *settings))
    return programs[settings]


def _decode_fn(model, batch, prompt_length, max_new_tokens, sampler):
    total = prompt_length + max_new_tokens  # S: cache length and output length

    def choose(logits, key, position, settings):
        """Token at ``position`` from the previous position's logits f32[B, V]."""
        return _sampling.sample(logits, jax.random.fold_in(key, position), sampler=sampler, **settings)

    def run(values, prompts, key, settings):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            caches = model.backbone.empty_caches(batch, total)  # L x (B, 2, S, K, D)
            logits, caches = model.call_with_cache(prompts, caches, 0)  # prefill: (B, P, V)
            tokens = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_length].set(prompts)  # (B, S)
            first = choose(logits[:, -1], key, prompt_length, settings)  # (B,)
            tokens = tokens.at[:, prompt_length].set(first)

            def step(index, carry):
                """Feed the token at ``index``, write the one at ``index + 1``."""
                tokens, caches = carry
                last = jax.lax.dynamic_slice_in_dim(tokens, index, 1, axis=1)  # (B, 1)
                logits, caches = model.call_with_cache(last, caches, index)  # (B, 1, V)
                chosen = choose(logits[:, -1], key, index + 1, settings)  # (B,)
                tokens = jax.lax.dynamic_update_slice_in_dim(tokens, chosen[:, None], index + 1, axis=1)
                return tokens, caches

            tokens, _ = jax.lax.fori_loop(prompt_length, total - 1, step, (tokens, caches))
        return tokens

    return run
