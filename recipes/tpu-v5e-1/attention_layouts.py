"""The attention sublayer's projections and RoPE written several ways, forward + backward, on one TPU chip.

    source .device/tpu-env.sh && OUT=/tmp/out python3 recipes/tpu-v5e-1/attention_layouts.py

Why: part 29's traces (docs/performance.md) show the projections around the splash kernel
running at 78-118 TFLOP/s where the MLP's matmuls run at 170-185, and a float32 RoPE
fusion over half-width (D/2 = 32) arrays taking 18.2 ms of gpt_350m's 210.2 ms step. Each
variant below computes the same x [B, T, C] -> y [B, T, C] (q, k, v projections, RoPE,
causal splash attention, output projection); the gradient of y's sum with respect to x and
the four kernels is timed (median of 5 timings of 5 calls) and compared with the zoo's
form ("zoo"). One JSON line per row, printed and appended to $OUT/layouts.jsonl.

- zoo: the layer as parts 32 and 33 ran it (einsum per projection, RoPE by halves in float32).
- library: the layer as it is now (RoPE by matmul in x's dtype since e6f0438).
- rope_bf16: RoPE in the activations' dtype (what Hugging Face's Llama does).
- flat: each projection a 2-D matmul of [B*T, C] by [C, H*D], reshaped after.
- fused: one matmul for q, k and v (their kernels concatenated over heads), split after.
- fused_bf16: fused with RoPE in bfloat16.
- no_rope: the zoo's form without RoPE (what RoPE costs).
- fused_flat_bf16: fused as one 2-D matmul, the output projection 2-D too, RoPE in bfloat16.
- matmul_f32, matmul_bf16: RoPE at full width, x's rotated halves ([-x2, x1]) a matmul by a
  fixed [D, D] matrix of +-1 (exact), so no array is D/2 wide; in float32 / bfloat16.

``VARIANTS=zoo,rope_bf16`` runs a subset.
"""

import json
import os

os.environ["KERAS_BACKEND"] = "jax"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from attention_kernels import timed_gradient  # noqa: E402  (this folder)

from zoo.kernels.splash_attention import splash_attention  # noqa: E402
from zoo.layers.rotary_embedding import apply_rotary_embedding, rotary_angles  # noqa: E402

SHAPES = {  # B, T, C, H, K, D
    "gpt_350m b8": (8, 1024, 1024, 16, 16, 64),
    "gpt_1b b2": (2, 2048, 2048, 32, 4, 64),
    "llama_3_2_1b b4": (4, 2048, 2048, 32, 8, 64),
    "qwen3_0.6b b4": (4, 2048, 1024, 16, 8, 128),
}
BASE = 10000.0
INTERPRET = jax.default_backend() != "tpu"  # off the chip: Pallas' interpreter, one tiny shape (a smoke run)
if INTERPRET:
    SHAPES = {"tiny": (1, 256, 128, 4, 2, 64)}


def _cos_sin(x, positions, base, scaling, *, full_width):
    """cos, sin f32[B|1, T, 1, D/2] (or D at full width) for x [B, T, H, D] at i32[T] / i32[B, T]."""
    angles = rotary_angles(positions, head_dim=x.shape[-1], base=base, scaling=scaling)  # f32[B|, T, D/2]
    if angles.ndim == 2:
        angles = angles[None]
    if full_width:
        angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def rope_bf16(x, positions, base=BASE, scaling=None):
    """RoPE in x's dtype: cos and sin cast to it, as transformers' Llama does."""
    cos, sin = (t.astype(x.dtype) for t in _cos_sin(x, positions, base, scaling, full_width=False))
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rotate_half_matrix(d, dtype):
    """P [D, D] with x @ P = rotate_half(x) = [-x2, x1]: exact (one +-1 per column)."""
    half = d // 2
    eye = jnp.eye(half, dtype=dtype)
    zero = jnp.zeros((half, half), dtype)
    return jnp.block([[zero, eye], [-eye, zero]])


def rope_by_matmul(compute_dtype):
    """RoPE at full width, its rotated half a matmul by P (no D/2-wide array)."""

    def rope(x, positions, base=BASE, scaling=None):
        cos, sin = (t.astype(compute_dtype) for t in _cos_sin(x, positions, base, scaling, full_width=True))
        rotated = jnp.einsum("bthd,de->bthe", x, rotate_half_matrix(x.shape[-1], x.dtype))
        return (x.astype(compute_dtype) * cos + rotated.astype(compute_dtype) * sin).astype(x.dtype)

    return rope


def rope_library(x, positions, base=BASE, scaling=None):
    """The library's RoPE as it is (the matmul form in x's dtype since e6f0438)."""
    return apply_rotary_embedding(x, positions, base=base, scaling=scaling)


def rope_f32(x, positions, base=BASE, scaling=None):
    """RoPE by halves in float32: the library's form until e6f0438 (parts 32 and 33's "zoo")."""
    cos, sin = _cos_sin(x, positions, base, scaling, full_width=False)
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(x.dtype)


def no_rope(x, positions):
    return x


def einsum_qkv(x, wq, wk, wv):
    return (
        jnp.einsum("btc,chd->bthd", x, wq),
        jnp.einsum("btc,ckd->btkd", x, wk),
        jnp.einsum("btc,ckd->btkd", x, wv),
    )


def flat_qkv(x, wq, wk, wv):
    b, t, c = x.shape
    rows = x.reshape(b * t, c)
    return tuple((rows @ w.reshape(c, -1)).reshape(b, t, w.shape[1], w.shape[2]) for w in (wq, wk, wv))


def fused_qkv(x, wq, wk, wv):
    h, kv = wq.shape[1], wk.shape[1]
    qkv = jnp.einsum("btc,cnd->btnd", x, jnp.concatenate([wq, wk, wv], axis=1))  # [B, T, H + 2K, D]
    return qkv[:, :, :h], qkv[:, :, h : h + kv], qkv[:, :, h + kv :]


def fused_flat_qkv(x, wq, wk, wv):
    b, t, c = x.shape
    h, kv, d = wq.shape[1], wk.shape[1], wq.shape[2]
    w = jnp.concatenate([wq, wk, wv], axis=1).reshape(c, (h + 2 * kv) * d)
    qkv = (x.reshape(b * t, c) @ w).reshape(b, t, h + 2 * kv, d)
    return qkv[:, :, :h], qkv[:, :, h : h + kv], qkv[:, :, h + kv :]


def einsum_out(out, wo):
    return jnp.einsum("bthd,hdc->btc", out, wo)


def flat_out(out, wo):
    b, t, h, d = out.shape
    return (out.reshape(b * t, h * d) @ wo.reshape(h * d, -1)).reshape(b, t, -1)


VARIANTS = {
    "zoo": (einsum_qkv, rope_f32),  # the library's form when parts 32 and 33 ran
    "library": (einsum_qkv, rope_library),
    "rope_bf16": (einsum_qkv, rope_bf16),
    "flat": (flat_qkv, rope_f32),
    "fused": (fused_qkv, rope_f32),
    "fused_bf16": (fused_qkv, rope_bf16),
    "no_rope": (einsum_qkv, no_rope),
    "fused_flat_bf16": (fused_flat_qkv, rope_bf16, flat_out),
    "matmul_f32": (einsum_qkv, rope_by_matmul(jnp.float32)),
    "matmul_bf16": (einsum_qkv, rope_by_matmul(jnp.bfloat16)),
}
if os.environ.get("VARIANTS"):  # a comma-separated subset, e.g. VARIANTS=zoo,rope_bf16
    VARIANTS = {name: VARIANTS[name] for name in os.environ["VARIANTS"].split(",")}


def sublayer(project, rope, output=einsum_out):
    def f(x, wq, wk, wv, wo):
        q, k, v = project(x, wq, wk, wv)
        positions = jnp.arange(x.shape[1], dtype=jnp.int32)
        q, k = rope(q, positions), rope(k, positions)
        out = splash_attention(q, k, v, causal=True, interpret=INTERPRET)  # [B, T, H, D]
        return output(out, wo)

    return f


def relative_gap(a, reference):
    """max |a - reference| / max |reference|, in float32."""
    a, reference = a.astype(jnp.float32), reference.astype(jnp.float32)
    return float(jnp.max(jnp.abs(a - reference)) / jnp.max(jnp.abs(reference)))


def main():
    out = os.environ["OUT"]
    for name, (b, t, c, h, kv, d) in SHAPES.items():
        keys = jax.random.split(jax.random.key(0), 5)
        x = jax.random.normal(keys[0], (b, t, c), jnp.bfloat16)
        ws = [
            (jax.random.normal(key, shape, jnp.float32) * c**-0.5).astype(jnp.bfloat16)
            for key, shape in zip(keys[1:], [(c, h, d), (c, kv, d), (c, kv, d), (h, d, c)])
        ]
        reference = None
        for variant, parts in VARIANTS.items():
            seconds, compile_s, grads = timed_gradient(sublayer(*parts), [x, *ws])
            if reference is None:
                reference = grads
            drift = max(relative_gap(a, r) for a, r in zip(grads, reference))
            row = dict(shape=name, variant=variant, ms=round(seconds * 1e3, 3), compile_s=round(compile_s, 1),
                       grad_relative_gap=drift)  # fmt: skip
            print(json.dumps(row), flush=True)
            with open(os.path.join(out, "layouts.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
