"""megablox's backward at tilings of its own, on one TPU chip: the sparse MoE layer's grouped matmuls.

    source .device/tpu-env.sh && OUT=/tmp/out python3 recipes/tpu-v5e-1/megablox_backward.py
    OUT=/tmp/out python3 recipes/tpu-v5e-1/megablox_backward.py row default|best E K -- ZOO_BENCH_MOE_ARGS

JAX's megablox VJP runs the rows' gradient (``gmm`` of the output's gradient by the weights
transposed) and the weights' (``tgmm``) at the forward's tiling; ``zoo.kernels.grouped_matmul``
gives each its own (``MEGABLOX_BACKWARD_TILING``). The first form times moe_tiles.py's step
(``zoo.kernels.moe.sparse_moe`` forward + backward, megablox, bf16, N = 4,096 tokens) at
E = 8, k = 2, F = 4,096 and E = 64, k = 8, F = 1,024 (C = 2,048), the forward at its measured
best (512, 1024, 1024) and one backward tiling changed at a time; one JSON line a row in
$OUT/megablox_backward.jsonl. The ``row`` form sets the backward tilings (``default``: the
forward's; ``best``: the fastest row of that E and k in the file) and runs the rest of its
arguments as ``zoo bench moe`` in this process.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
from moe_tiles import CONFIGS, TOKENS, step_of, timed  # this folder

from zoo.kernels import grouped_matmul

FORWARD = grouped_matmul.MEGABLOX_TILING
ROWS = [(256, 1024, 1024), (512, 512, 1024), (512, 1024, 512), (1024, 512, 512), (1024, 1024, 512)]
WEIGHTS = [
    (256, 1024, 1024),
    (1024, 1024, 512),
    (1024, 512, 1024),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 512, 512),
]
RESULTS = "megablox_backward.jsonl"


def candidates():
    """(rows, weights) backward tilings: the forward's for both, then one of them changed."""
    yield FORWARD, FORWARD
    yield from ((rows, FORWARD) for rows in ROWS)
    yield from ((FORWARD, weights) for weights in WEIGHTS)


def inputs(num_experts, width, hidden):
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (TOKENS, width), jnp.bfloat16)
    router = jax.random.normal(keys[1], (width, num_experts), jnp.float32)
    experts = {
        "expert_gate": jax.random.normal(keys[2], (num_experts, width, hidden), jnp.bfloat16) * 0.02,
        "expert_up": jax.random.normal(keys[3], (num_experts, width, hidden), jnp.bfloat16) * 0.02,
        "expert_down": jax.random.normal(keys[4], (num_experts, hidden, width), jnp.bfloat16) * 0.02,
    }
    return x, router, experts


def sweep():
    for num_experts, k, width, hidden in CONFIGS:
        args = inputs(num_experts, width, hidden)
        flops = 3 * 3 * 2 * TOKENS * k * width * hidden
        for rows, weights in candidates():
            grouped_matmul.MEGABLOX_BACKWARD_TILING = {"rows": rows, "weights": weights}
            row = {"E": num_experts, "k": k, "C": width, "F": hidden, "rows": rows, "weights": weights}
            try:
                seconds = timed(step_of("megablox", num_experts, k), *args)
                row.update(ms=round(seconds * 1e3, 3), tflops=round(flops / seconds / 1e12, 1))
            except Exception as error:  # a tiling the core's memory cannot take: recorded, the sweep goes on
                row["error"] = f"{type(error).__name__}: {str(error)[:120]}"
            print(json.dumps(row), flush=True)
            with open(os.path.join(os.environ["OUT"], RESULTS), "a") as handle:
                handle.write(json.dumps(row) + "\n")


def best(num_experts, k):
    with open(os.path.join(os.environ["OUT"], RESULTS)) as handle:
        rows = [json.loads(line) for line in handle]
    mine = [r for r in rows if (r["E"], r["k"]) == (num_experts, k) and "ms" in r]
    fastest = min(mine, key=lambda r: r["ms"])
    return {"rows": tuple(fastest["rows"]), "weights": tuple(fastest["weights"])}


def row(choice, num_experts, k, args):
    tilings = {"rows": FORWARD, "weights": FORWARD} if choice == "default" else best(num_experts, k)
    grouped_matmul.MEGABLOX_BACKWARD_TILING = tilings
    print(f"megablox_backward.py: E={num_experts} k={k}, backward tilings {tilings}", flush=True)
    from zoo.cli.main import main as zoo_main

    return zoo_main(["bench", "moe", *args])


if __name__ == "__main__":
    if sys.argv[1:2] == ["row"]:
        choice, num_experts, k, separator, *rest = sys.argv[2:]
        assert choice in ("default", "best") and separator == "--", "usage: row default|best E K -- ARGS"
        sys.exit(row(choice, int(num_experts), int(k), rest))
    sweep()
