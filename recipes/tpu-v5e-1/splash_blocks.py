"""Splash attention's block sizes at the shapes of the zoo's models, forward + backward, on one TPU chip.

    source .device/tpu-env.sh && OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_blocks.py

Shapes (B, T, H, K, D): gpt_1b's at batch 2 and 4 (32 / 4 heads of 64), llama_3_2_1b's
(32 / 8 of 64), qwen3_0.6b's (16 / 8 of 128), all at 2,048 tokens, and gpt_350m's (16 / 16
of 64 at 1,024 tokens); causal, bf16. Each candidate is a ``BlockSizes`` (fused backward)
given as forward (block_q, block_kv, block_kv_compute) and backward (block_q_dkv,
block_kv_dkv, block_kv_dkv_compute), run as the zoo runs it (``zoo.kernels.splash_attention``:
the multi-query kernel once per KV head, vmapped over B and K). Each row: the median of 5
timings of 5 calls of the jitted gradient, model FLOPs 4 B T^2 H D x 3 / 2 (causal halved).
One JSON line per row, printed and appended to $OUT/blocks.jsonl.
"""

import json
import os

os.environ["KERAS_BACKEND"] = "jax"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from attention_kernels import splash_with, timeit  # noqa: E402  (this folder: the kernel table's own)

SHAPES = {
    "gpt_1b b2": (2, 2048, 32, 4, 64),
    "gpt_1b b4": (4, 2048, 32, 4, 64),
    "llama_3_2_1b b4": (4, 2048, 32, 8, 64),
    "qwen3_0.6b b4": (4, 2048, 16, 8, 128),
    "gpt_350m b8": (8, 1024, 16, 16, 64),
}
# (forward (q, kv, kv_compute), backward (q_dkv, kv_dkv, kv_dkv_compute))
CANDIDATES = [
    ((512, 512, 512), (512, 512, 512)),
    ((1024, 1024, 1024), (1024, 1024, 1024)),
    ((1024, 512, 512), (1024, 512, 512)),
    ((1024, 1024, 512), (1024, 1024, 512)),
    ((2048, 512, 512), (2048, 512, 512)),
    ((2048, 1024, 512), (1024, 1024, 512)),
    ((1024, 1024, 512), (512, 1024, 512)),
    ((512, 1024, 512), (512, 1024, 512)),
    ((1024, 2048, 512), (1024, 2048, 512)),
    ((2048, 2048, 1024), (2048, 2048, 1024)),
    ((256, 512, 256), (256, 512, 256)),
]


def splash(b, t, h, kv, d, forward, backward, **options):
    """Causal splash with the fused backward at these forward and backward block sizes;
    ``options``: other ``BlockSizes`` arguments (q, k, v layouts)."""
    names = ("block_q", "block_kv", "block_kv_compute"), ("block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute")
    sizes = dict(zip(names[0], forward)) | dict(zip(names[1], backward)) | {"use_fused_bwd_kernel": True}
    return splash_with(b, t, h, kv, d, sizes | options)


def inputs(b, t, h, kv, d):
    """Random bf16 q (B, T, H, D), k and v (B, T, K, D)."""
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, t, h, d), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, t, kv, d), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, t, kv, d), jnp.bfloat16)
    return q, k, v


def timed_row(row, f, qkv, rows_file):
    """``row`` with f's forward + backward ms and TFLOP/s (4 B T^2 H D x 3 / 2) at ``qkv``, or
    the error the kernel raised; printed and appended to $OUT/``rows_file`` as a JSON line."""
    (b, t, h, _), d = qkv[0].shape[:4], qkv[0].shape[-1]
    flops = 4 * b * t * t * h * d * 3 / 2
    try:
        seconds, compile_s = timeit(f, *qkv)
        row.update(ms=round(seconds * 1e3, 3), tflops=round(flops / seconds / 1e12, 1), compile_s=round(compile_s, 1))
    except Exception as error:  # a shape or layout the kernel refuses: say so, go on
        row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
    line = json.dumps(row)
    print(line, flush=True)
    with open(os.path.join(os.environ["OUT"], rows_file), "a") as handle:
        handle.write(line + "\n")


def main():
    for name, (b, t, h, kv, d) in SHAPES.items():
        qkv = inputs(b, t, h, kv, d)
        for forward, backward in CANDIDATES:
            if max(forward + backward) > t:
                continue
            row = {"shape": name, "B_T_H_K_D": [b, t, h, kv, d], "forward": forward, "backward": backward}
            timed_row(row, splash(b, t, h, kv, d, forward, backward), qkv, "blocks.jsonl")


if __name__ == "__main__":
    main()
