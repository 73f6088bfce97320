"""Rotary position embedding (RoPE) as pure functions of the tokens' global positions.

RoPE rotates each (x[i], x[i + D/2]) pair of a query or key head by an angle
``position * base ** (-2i / D)`` (the "rotate half" layout of GPT-NeoX, LLaMA and
KerasHub). The score q.k then depends on the two positions only through their
difference. Everything is elementwise in the sequence, so a shard can rotate its own
tokens if it knows their *global* positions: under sequence parallelism with load
balancing those are ``zoo.kernels.shard_positions``, not ``0..T/N-1``.

Letters: B batch, T tokens (of this shard, inside ``shard_map``), H heads, D head dim.
"""

import jax.numpy as jnp

__all__ = ["apply_rotary_embedding", "check_rotary_head_dim", "rotary_angles"]

F32 = jnp.float32


def check_rotary_head_dim(head_dim):
    """Raises unless ``head_dim`` is even (RoPE rotates pairs of features)."""
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got head_dim {head_dim}")


def rotary_angles(positions, *, head_dim, base=10000.0):
    """f32[..., T, D/2]: angle of each rotated pair at each position.

    positions: i32[T] or i32[B, T], global token positions.
    """
    check_rotary_head_dim(head_dim)
    half = head_dim // 2
    inverse_frequency = base ** (-jnp.arange(half, dtype=F32) / half)  # f32[D/2]
    return jnp.asarray(positions, F32)[..., None] * inverse_frequency


def apply_rotary_embedding(x, positions, *, base=10000.0):
    """Rotates x: [B, T, H, D] by its tokens' positions; returns x's shape and dtype.

    positions: i32[T] (shared by the batch) or i32[B, T], global positions of the T
    tokens of x, in the order x holds them. Computed in float32 for any input dtype.
    """
    head_dim = x.shape[-1]
    angles = rotary_angles(positions, head_dim=head_dim, base=base)  # f32[B|, T, D/2]
    if angles.ndim == 2:
        angles = angles[None]
    cos = jnp.cos(angles)[:, :, None, :]  # f32[B|1, T, 1, D/2]
    sin = jnp.sin(angles)[:, :, None, :]
    first, second = jnp.split(x.astype(F32), 2, axis=-1)  # f32[B, T, H, D/2] each
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)
