"""The key/value cache of cached decoding: how one call's new keys and values are written
(``MultiHeadAttention._call_with_cache``): into the whole-length cache at their positions,
or into a window-sized ring buffer (a sliding-window layer)."""

import jax
import jax.numpy as jnp


def write_linear(cache, new, cache_index, positions):
    """The whole-length cache: ``new`` (B, 2, T, K, D) written at cache positions
    ``cache_index``..; the queries attend to the updated cache, its slot s holding
    position s. Returns ``(keys (B, 2, S, K, D), their positions i32[S], the cache)``."""
    cache = jax.lax.dynamic_update_slice(cache, new, (0, 0, cache_index, 0, 0))  # (B, 2, S, K, D)
    return cache, jnp.arange(cache.shape[2], dtype=jnp.int32), cache


def write_ring(cache, new, cache_index, positions):
    """A window-sized ring buffer (S = W slots): slot s holds the latest position p <
    ``cache_index`` with p % S == s (negative: never written). The T new tokens' queries
    attend to the buffer and to the new keys themselves (a prefill longer than the window
    included), masked by position; then the last min(T, S) new tokens are written into
    their slots (distinct, so the scatter is well defined). Returns ``(keys (B, 2, S + T,
    K, D), their positions i32[S + T], the new buffer (B, 2, S, K, D))``."""
    slots = cache.shape[2]
    slot = jnp.arange(slots, dtype=jnp.int32)  # i32[S]
    held = slot + slots * jnp.floor_divide(cache_index - 1 - slot, slots)  # i32[S]: < 0 where never written
    keys = jnp.concatenate([cache, new], axis=2)  # (B, 2, S + T, K, D)
    kept = min(new.shape[2], slots)
    tail_positions = positions[-kept:]  # i32[kept]
    cache = cache.at[:, :, tail_positions % slots].set(new[:, :, -kept:])  # (B, 2, S, K, D)
    return keys, jnp.concatenate([held, positions]), cache
