"""The sparse MoE layer's grouped matmul on one TPU chip: jax.lax.ragged_dot against JAX's
Pallas grouped matmul (megablox) at several tilings, forward + backward, bf16.

For each (E, k, C, F) at N tokens: ``zoo.kernels.moe.sparse_moe`` (route-sorted rows, the
three SwiGLU matmuls grouped by expert, weighted scatter back) under ``jax.jit`` with
gradients of x and every expert weight; ``megablox`` once per largest tiling
(``zoo.kernels.grouped_matmul.MEGABLOX_TILING``, halved per dimension to divide it). Timed as the
median of 5 runs of 10 calls after a warm-up call; TFLOP/s counts the routed work only
(3 matmuls of 2 N k C F, times 3 for forward + backward). Writes $OUT/moe_tiles.md.

    source .device/tpu-env.sh && OUT=$OUT python3 recipes/tpu-v5e-1/moe_tiles.py
"""

import os
import statistics
import time

import jax
import jax.numpy as jnp

from zoo.kernels import grouped_matmul, moe

CONFIGS = [(8, 2, 2048, 4096), (64, 8, 2048, 1024)]  # (E, k, C, F): Mixtral-like, fine-grained (OLMoE-like)
TOKENS = 4096
TILINGS = [(128, 128, 128), (256, 512, 512), (512, 512, 512), (512, 1024, 1024), (1024, 1024, 1024), (512, 2048, 2048)]


def step_of(implementation, num_experts, k):
    def loss(x, weights, experts):
        ids = jax.lax.top_k(x.astype(jnp.float32) @ weights, k)[1]  # [N, k] by a fixed router
        routing = jnp.full(ids.shape, 1.0 / k, jnp.float32)
        y = moe.sparse_moe(x, routing, ids, **experts, implementation=implementation)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 2)))


def timed(step, *args):
    jax.block_until_ready(step(*args))
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10):
            out = step(*args)
        jax.block_until_ready(out)
        runs.append((time.perf_counter() - start) / 10)
    return statistics.median(runs)


def main():
    lines = [
        f"Sparse MoE forward + backward on {jax.devices()[0].device_kind}, bf16, N = {TOKENS:,} tokens; ms (TFLOP/s of the routed work); jax {jax.__version__}",
        "",
        "| E | k | C | F | ragged_dot | " + " | ".join(f"megablox {'x'.join(map(str, t))}" for t in TILINGS) + " |",
        "| ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in TILINGS) + " |",
    ]
    default_tiling = grouped_matmul.MEGABLOX_TILING
    for num_experts, k, width, hidden in CONFIGS:
        keys = jax.random.split(jax.random.key(0), 5)
        x = jax.random.normal(keys[0], (TOKENS, width), jnp.bfloat16)
        router = jax.random.normal(keys[1], (width, num_experts), jnp.float32)
        experts = {
            "expert_gate": jax.random.normal(keys[2], (num_experts, width, hidden), jnp.bfloat16) * 0.02,
            "expert_up": jax.random.normal(keys[3], (num_experts, width, hidden), jnp.bfloat16) * 0.02,
            "expert_down": jax.random.normal(keys[4], (num_experts, hidden, width), jnp.bfloat16) * 0.02,
        }
        flops = 3 * 3 * 2 * TOKENS * k * width * hidden
        cells = []
        for implementation, tiling in [("ragged_dot", None)] + [("megablox", t) for t in TILINGS]:
            grouped_matmul.MEGABLOX_TILING = tiling or default_tiling
            try:
                seconds = timed(step_of(implementation, num_experts, k), x, router, experts)
                cells.append(f"{seconds * 1e3:.2f} ({flops / seconds / 1e12:.1f})")
            except Exception as error:  # a tiling the core's memory cannot take: recorded, the sweep goes on
                cells.append(f"failed: {type(error).__name__}")
            print(num_experts, k, implementation, tiling, cells[-1], flush=True)
        lines.append(f"| {num_experts} | {k} | {width} | {hidden} | " + " | ".join(cells) + " |")
    grouped_matmul.MEGABLOX_TILING = default_tiling
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(os.environ.get("OUT", "."), "moe_tiles.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
