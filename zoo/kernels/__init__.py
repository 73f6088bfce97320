"""Pure JAX kernels that run on one shard inside ``jax.shard_map`` (no Keras here)."""
