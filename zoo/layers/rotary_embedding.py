"""Rotary position embedding (RoPE) as pure functions of the tokens' global positions.

RoPE rotates each (x[i], x[i + D/2]) pair of a query or key head by an angle
``position * inverse_frequency[i]``, with ``inverse_frequency[i] = base ** (-2i / D)``
(the "rotate half" layout of GPT-NeoX, LLaMA and KerasHub). The score q.k then depends
on the two positions only through their difference. Everything is elementwise in the
sequence, so a shard can rotate its own tokens if it knows their *global* positions:
under sequence parallelism with load balancing those are ``zoo.kernels.shard_positions``,
not ``0..T/N-1``.

Llama 3's ``rope_scaling`` (``rope_type`` ``"llama3"``) stretches the long wavelengths
of the inverse frequencies for longer context (``llama3_inverse_frequency``); it is the
only scaling supported, every other ``rope_type`` is refused by ``check_rope_scaling``.

Letters: B batch, T tokens (of this shard, inside ``shard_map``), H heads, D head dim.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = [
    "LLAMA3_SCALING_KEYS",
    "Rope",
    "apply_rotary_embedding",
    "check_rope_scaling",
    "check_rotary_head_dim",
    "inverse_frequency",
    "rotary_angles",
    "rotate_half_matrix",
]

F32 = jnp.float32
# rope_scaling keys of rope_type "llama3" (Hugging Face's config.json names)
LLAMA3_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_rotary_head_dim(head_dim):
    """Raises unless ``head_dim`` is even (RoPE rotates pairs of features)."""
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got head_dim {head_dim}")


def check_rope_scaling(rope_scaling):
    """``rope_scaling`` as a plain dict (or None), after checking it is Llama 3's.

    Accepts None or ``{"rope_type": "llama3", "factor": ..., "low_freq_factor": ...,
    "high_freq_factor": ..., "original_max_position_embeddings": ...}`` (``"type"`` is
    read as ``"rope_type"``, as older Hugging Face configs wrote it). Raises
    ``ValueError`` naming the offending key or value.
    """
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling must be None or a dict, got {rope_scaling!r}")
    scaling = dict(rope_scaling)
    rope_type = scaling.pop("rope_type", scaling.pop("type", None))
    if rope_type != "llama3":
        raise ValueError(
            f"rope_scaling rope_type {rope_type!r} is not supported: only 'llama3' (Llama 3.1 / 3.2) is; "
            f"got rope_scaling {rope_scaling}"
        )
    missing = [key for key in LLAMA3_SCALING_KEYS if key not in scaling]
    unknown = sorted(set(scaling) - set(LLAMA3_SCALING_KEYS))
    if missing or unknown:
        raise ValueError(
            f"rope_scaling of rope_type 'llama3' needs exactly {list(LLAMA3_SCALING_KEYS)}; missing {missing}, unknown {unknown}"
        )
    for key in LLAMA3_SCALING_KEYS:
        if not isinstance(scaling[key], (int, float)) or isinstance(scaling[key], bool) or not scaling[key] > 0:
            raise ValueError(f"rope_scaling {key} must be a positive number, got {scaling[key]!r}")
    if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError(
            f"rope_scaling high_freq_factor {scaling['high_freq_factor']} must exceed low_freq_factor {scaling['low_freq_factor']}"
        )
    return {"rope_type": "llama3", **{key: scaling[key] for key in LLAMA3_SCALING_KEYS}}


def inverse_frequency(head_dim, base=10000.0, scaling=None):
    """f32[D/2]: the rotation speed of each feature pair (radians per position).

    Computed with jnp operations from Python numbers, not held as an array constant: a
    rematerialised block (``jax.checkpoint``) then recomputes it instead of saving it.
    """
    check_rotary_head_dim(head_dim)
    frequency = jnp.asarray(base, F32) ** (-jnp.arange(0, head_dim, 2, dtype=F32) / head_dim)  # f32[D/2]
    scaling = check_rope_scaling(scaling)
    if scaling is not None:
        frequency = llama3_inverse_frequency(frequency, **{key: scaling[key] for key in LLAMA3_SCALING_KEYS})
    return frequency


def llama3_inverse_frequency(frequency, *, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Llama 3's frequency stretch: wavelengths longer than ``original / low_freq_factor``
    are slowed by ``factor``, shorter than ``original / high_freq_factor`` kept, and the
    band between interpolated smoothly (Meta's ``apply_scaling``; f32[D/2] -> f32[D/2])."""
    wavelength = 2 * math.pi / frequency
    long_wavelength = original_max_position_embeddings / low_freq_factor
    short_wavelength = original_max_position_embeddings / high_freq_factor
    smooth = (original_max_position_embeddings / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    interpolated = (1 - smooth) * frequency / factor + smooth * frequency
    scaled = jnp.where(wavelength > long_wavelength, frequency / factor, frequency)
    in_band = (wavelength >= short_wavelength) & (wavelength <= long_wavelength)
    return jnp.where(in_band, interpolated, scaled)


def rotary_angles(positions, *, head_dim, base=10000.0, scaling=None):
    """f32[..., T, D/2]: angle of each rotated pair at each position.

    positions: i32[T] or i32[B, T], global token positions.
    """
    frequency = inverse_frequency(head_dim, base, scaling)  # f32[D/2]
    return jnp.asarray(positions, F32)[..., None] * frequency


def apply_rotary_embedding(x, positions, *, base=10000.0, scaling=None):
    """Rotates x: [B, T, H, D] by its tokens' positions; returns x's shape and dtype.

    positions: i32[T] (shared by the batch) or i32[B, T], global positions of the T
    tokens of x, in the order x holds them. The angles are computed in float32, the
    rotation in x's dtype (cos and sin cast to it, as transformers' Llama does).
    scaling: None or a Llama 3 ``rope_scaling`` dict (``check_rope_scaling``).

    The rotation is written at full width: x * [cos, cos] + rotate_half(x) * [sin, sin],
    rotate_half(x) = [-x2, x1] taken as x @ P for a fixed [D, D] matrix of +-1 and 0
    (``rotate_half_matrix``: one nonzero per column, so the product is exact). Splitting
    x into its halves instead makes arrays D/2 wide, which a TPU pads to its 128 lanes:
    on one TPU v5e chip that form took 1.3 ms of a gpt_350m block's 4.5 ms attention
    (forward + backward), this one none measurable, and gpt_350m's step went from 210.1
    to 184.2 ms (docs/performance.md, thirteenth session).
    """
    head_dim = x.shape[-1]
    angles = rotary_angles(positions, head_dim=head_dim, base=base, scaling=scaling)  # f32[B|, T, D/2]
    if angles.ndim == 2:
        angles = angles[None]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # f32[B|1, T, 1, D]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    rotated = jnp.einsum(
        "bthd,de->bthe", x, rotate_half_matrix(head_dim, x.dtype), precision=jax.lax.Precision.HIGHEST
    )  # [B, T, H, D]: [-x2, x1], exact
    return x * cos + rotated * sin


def rotate_half_matrix(head_dim, dtype=F32):
    """P [D, D] with x @ P = [-x2, x1] for x = [x1, x2] (halves of D/2)."""
    half = head_dim // 2
    identity, zero = jnp.eye(half, dtype=dtype), jnp.zeros((half, half), dtype)
    return jnp.block([[zero, identity], [-identity, zero]])


@dataclasses.dataclass(frozen=True)
class Rope:
    """A layer's rotary settings, hashable (it keys the cached ``shard_map`` programs).

    base: RoPE's base wavelength; scaling: a checked Llama 3 ``rope_scaling`` as sorted
    ``(key, value)`` pairs, or ``()`` for none (``Rope.of`` builds it from a dict).
    """

    base: float = 10000.0
    scaling: tuple = ()

    @classmethod
    def of(cls, base, rope_scaling=None):
        scaling = check_rope_scaling(rope_scaling)
        return cls(float(base), () if scaling is None else tuple(sorted(scaling.items())))

    def apply(self, x, positions):
        """``apply_rotary_embedding`` with these settings: x [B, T, H, D] at i32[T] or i32[B, T]."""
        return apply_rotary_embedding(x, positions, base=self.base, scaling=dict(self.scaling) or None)
