"""Next-token samplers for ``GPTCausalLM.generate``: greedy, top-k and top-p (nucleus).

Each takes the last position's logits f32[B, V] and a ``jax.random`` key and returns
the chosen ids i32[B]. The same key gives the same tokens; ties go to the lower id.
"""

import jax
import jax.numpy as jnp

from zoo.config.choices import SAMPLERS


def check_sampler(sampler, *, temperature, top_k, top_p, vocabulary_size):
    """Raise ``ValueError`` naming the bad setting."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if sampler == "top_k" and (
        not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= vocabulary_size
    ):
        raise ValueError(
            f"sampler 'top_k' needs an integer top_k in [1, vocabulary size {vocabulary_size}], got {top_k!r}"
        )
    if sampler == "top_p" and (top_p is None or not 0.0 < top_p <= 1.0):
        raise ValueError(f"sampler 'top_p' needs top_p in (0, 1], got {top_p!r}")


def sample(logits, key, *, sampler, temperature=1.0, top_k=None, top_p=None):
    """i32[B] next ids from f32[B, V] logits; every setting but ``sampler`` may be traced."""
    if sampler == "greedy":
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    values, ids = jax.lax.top_k(logits.astype(jnp.float32) / temperature, logits.shape[-1])  # f32, i32[B, V] descending
    if sampler == "top_k":
        kept = jnp.arange(values.shape[-1]) < top_k  # bool[V]: the top_k likeliest
    else:
        probs = jax.nn.softmax(values, axis=-1)  # f32[B, V]
        kept = jnp.cumsum(probs, axis=-1) - probs < top_p  # mass of the likelier tokens; the first is always kept
    choice = jax.random.categorical(key, jnp.where(kept, values, -jnp.inf), axis=-1)  # i32[B]
    return jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
