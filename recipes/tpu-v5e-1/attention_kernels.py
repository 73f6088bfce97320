"""Causal attention forward + backward on one TPU chip: the zoo's tiled kernel at three tile
edges against JAX's Pallas splash kernel at four block shapes, fused backward or not.

    source .device/tpu-env.sh && OUT=/tmp/out python3 recipes/tpu-v5e-1/attention_kernels.py

Shapes (B, T, H, K, D): gpt_1b's (2, 2048, 32, 4, 64) and (1, 8192, 32, 8, 64), Qwen3's
heads (4, 2048, 16, 8, 128) and (1, 8192, 16, 8, 128); bf16 inputs. Splash runs its
multi-query kernel once per KV head (``vmap`` over B and K: K/V never repeated), q
pre-scaled. Each row: the median of 5 timings of 5 calls of the jitted gradient
(``block_until_ready``), model FLOPs 4 B T^2 H D x 3 / 2 (causal halved). One JSON line
per row, printed and appended to $OUT/attn.jsonl; docs/performance.md holds the table.
"""

import functools
import json
import os
import statistics
import time

os.environ["KERAS_BACKEND"] = "jax"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from zoo.kernels.blockwise_attention import blockwise_attention  # noqa: E402

SHAPES = [(2, 2048, 32, 4, 64), (1, 8192, 32, 8, 64), (4, 2048, 16, 8, 128), (1, 8192, 16, 8, 128)]
SPLASH_BLOCKS = [(512, 512), (1024, 1024), (512, 1024), (2048, 512)]


def timeit(f, *args):
    """(median seconds per call, compile seconds) of the gradient of f's sum."""
    seconds, compile_s, _ = timed_gradient(f, args)
    return seconds, compile_s


def timed_gradient(f, args):
    """(median seconds per call, compile seconds, gradients) of the jitted gradient of f's
    sum with respect to every argument: the median of 5 timings of 5 calls."""
    g = jax.jit(jax.grad(lambda *a: f(*a).astype(jnp.float32).sum(), argnums=tuple(range(len(args)))))
    start = time.perf_counter()
    grads = jax.block_until_ready(g(*args))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(5):
            result = g(*args)
        jax.block_until_ready(result)
        times.append((time.perf_counter() - start) / 5)
    return statistics.median(times), compile_s, grads


def splash(b, t, h, kv, d, block_q, block_kv, fused):
    sizes = dict(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=block_kv,
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=block_kv,
    )
    if fused:
        sizes["use_fused_bwd_kernel"] = True
    else:
        sizes.update(block_q_dq=block_q, block_kv_dq=block_kv)
    return splash_with(b, t, h, kv, d, sizes)


def splash_with(b, t, h, kv, d, sizes):
    """Causal splash at these ``BlockSizes`` arguments, as the zoo runs it: the multi-query
    kernel once per KV head (vmapped over B and K), q pre-scaled."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    groups = h // kv
    mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(groups)])
    kernel = sk.make_splash_mqa_single_device(mask, block_sizes=sk.BlockSizes(**sizes))

    def f(q, k, v):  # q (B, T, H, D); k, v (B, T, K, D)
        qh = (q * d**-0.5).reshape(b, t, kv, groups, d).transpose(0, 2, 3, 1, 4)  # B K G T D
        kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # B K T D
        out = jax.vmap(jax.vmap(kernel))(qh, kh, vh)  # B K G T D
        return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)

    return f


def main():
    out = os.environ["OUT"]
    for b, t, h, kv, d in SHAPES:
        keys = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(keys[0], (b, t, h, d), jnp.bfloat16)
        k = jax.random.normal(keys[1], (b, t, kv, d), jnp.bfloat16)
        v = jax.random.normal(keys[2], (b, t, kv, d), jnp.bfloat16)
        flops = 4 * b * t * t * h * d * 3 / 2
        candidates = {
            f"tiled{e}": functools.partial(blockwise_attention, causal=True, block_size=e) for e in (256, 512, 1024)
        }
        for block_q, block_kv in SPLASH_BLOCKS:
            for fused in (False, True):
                if block_q <= t and block_kv <= t:
                    candidates[f"splash{block_q}x{block_kv}{'f' if fused else ''}"] = (block_q, block_kv, fused)
        for name, candidate in candidates.items():
            try:
                f = splash(b, t, h, kv, d, *candidate) if isinstance(candidate, tuple) else candidate
                seconds, compile_s = timeit(f, q, k, v)
                row = dict(
                    shape=[b, t, h, kv, d],
                    kernel=name,
                    ms=seconds * 1e3,
                    tflops=flops / seconds / 1e12,
                    compile_s=compile_s,
                )
            except Exception as error:  # a block shape the chip's VMEM cannot hold: recorded, not fatal
                row = dict(shape=[b, t, h, kv, d], kernel=name, error=repr(error)[:400])
            print(json.dumps(row), flush=True)
            with open(f"{out}/attn.jsonl", "a") as handle:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
