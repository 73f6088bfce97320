"""Issue 44's attention rows at 2,048, 8,192 and 32,768 tokens: the library's splash beside larger blocks, on one TPU chip.

    source .device/tpu-env.sh && OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_long.py [--large]
    OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_long.py row square -- --config-name gpt_1b --num-layers 8 ...

Shapes (B, T, H, K, D): issue 44's, batch 1, 32 / 8 heads of 64 and 16 / 8 heads of 128, causal,
bf16. Each shape first times the library's own ``zoo.kernels.splash_attention.splash_attention``
(its blocks: 1,024 x 1,024, keys computed 512 at a time, and its (q, k, v) layouts), then the same
kernel with other (block_q, block_kv, block_kv_compute), forward and fused backward alike, in the
library's layouts. ``--large`` times only blocks of 2,048, which the TPU compiler's default scoped
VMEM refused (splash_blocks.py): run it with ``LIBTPU_INIT_ARGS=--xla_tpu_scoped_vmem_limit_kib=...``.
The ``row`` form runs the rest of its arguments as ``zoo bench step`` in this process, with the
library's blocks (``library``) or with key blocks of 1,024 at every length (``square``, the library
before ``LONG_KEYS``): a step's gain from the long keys' blocks. Each row: the median of 5 timings of 5 calls of the jitted gradient, TFLOP/s with causal FLOPs
halved (4 B T^2 H D x 3 / 2); one JSON line a row, printed and appended to $OUT/splash_long.jsonl.
"""

import functools
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
import splash_blocks  # noqa: E402  (this folder)
from splash_blocks import inputs, timed_row  # noqa: E402

import zoo.kernels.splash_attention as splash  # noqa: E402

SHAPES = {
    "2k D64": (1, 2048, 32, 8, 64),
    "8k D64": (1, 8192, 32, 8, 64),
    "32k D64": (1, 32768, 32, 8, 64),
    "2k D128": (1, 2048, 16, 8, 128),
    "8k D128": (1, 8192, 16, 8, 128),
    "32k D128": (1, 32768, 16, 8, 128),
}
BLOCKS = [(1024, 1024, 1024), (2048, 1024, 512), (1024, 2048, 512), (2048, 1024, 1024)]  # (q, kv, kv compute)
LARGE = [(2048, 2048, 512), (2048, 2048, 1024), (4096, 1024, 512)]
ROWS = "splash_long.jsonl"


def with_blocks(b, t, h, kv, d, blocks):
    """Causal splash at these blocks, forward and fused backward, in the library's layouts for ``d``."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    q, k, v = (sk.QKVLayout[name] for name in splash.layouts(d))
    return splash_blocks.splash(b, t, h, kv, d, blocks, blocks, q_layout=q, k_layout=k, v_layout=v)


def main(large):
    for name, shape in SHAPES.items():
        qkv = inputs(*shape)
        t, d = shape[1], shape[-1]
        if not large:
            row = {"shape": name, "B_T_H_K_D": list(shape), "blocks": "library", "layouts": splash.layouts(d)}
            timed_row(row, functools.partial(splash.splash_attention, causal=True), qkv, ROWS)
        for blocks in LARGE if large else BLOCKS:
            if max(blocks) > t:
                continue
            row = {
                "shape": name,
                "B_T_H_K_D": list(shape),
                "blocks": blocks,
                "vmem": os.environ.get("LIBTPU_INIT_ARGS"),
            }
            timed_row(row, with_blocks(*shape, blocks), qkv, ROWS)


def row(blocks, args):
    if blocks == "square":
        splash.LONG_KEYS = float("inf")  # key blocks as query blocks, at every length
    print(f"splash_long.py: {blocks} blocks, 8,192 x 8,192 as {splash.block_edges(8192, 8192)}", flush=True)
    from zoo.cli.main import main as zoo_main

    return zoo_main(["bench", "step", *args])


if __name__ == "__main__":
    if sys.argv[1:2] == ["row"]:
        blocks, separator, *rest = sys.argv[2:]
        assert blocks in ("library", "square") and separator == "--", "usage: splash_long.py row library|square -- ARGS"
        sys.exit(row(blocks, rest))
    main(large="--large" in sys.argv[1:])
