"""Splash attention's q, k, v layouts at the zoo's head dims, on one TPU chip; then a step row with the fastest.

    source .device/tpu-env.sh
    OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_layouts.py
    OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_layouts.py row "gpt_1b b2" -- --config-name gpt_1b --num-layers 8 --batch-size 2

Splash reads each of q, k and v in blocks of (T, D) (``HEAD_DIM_MINOR``, the zoo's layout
until this was measured) or (D, T) (``SEQ_MINOR``). At head dim 64 a (T, 64) block fills
half of the TPU's 128 lanes; a (64, T) block fills them all. The first form times the
library's own ``zoo.kernels.splash_attention.splash_attention`` (its block sizes) with each
layout in ``zoo.kernels.splash_attention.LAYOUTS``, forward + backward, at the shapes of
splash_blocks.py and issue 44's at 8,192 tokens: the median of 5 timings of 5 calls of the jitted gradient. One JSON line
a row, printed and appended to $OUT/splash_layouts.jsonl. The ``row`` form puts the fastest
layout of SHAPE (from that file, same call) in ``LAYOUTS`` for its head dim and runs the
rest of the arguments as ``zoo bench step`` in this process.
"""

import functools
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
from splash_blocks import SHAPES, inputs, timed_row  # noqa: E402  (this folder)

import zoo.kernels.splash_attention as splash  # noqa: E402

H, S = splash.HEAD_DIM_MINOR, splash.SEQ_MINOR
SHAPES = SHAPES | {"8k D64": (1, 8192, 32, 8, 64), "8k D128": (1, 8192, 16, 8, 128)}  # issue 44's long rows
CANDIDATES = [(H, H, H), (H, S, S), (H, S, H), (H, H, S), (S, S, S)]  # (q, k, v)
ROWS = "splash_layouts.jsonl"


def measure():
    for name, (b, t, h, kv, d) in SHAPES.items():
        qkv = inputs(b, t, h, kv, d)
        for layouts in CANDIDATES:
            splash.LAYOUTS[d] = layouts
            row = {"shape": name, "B_T_H_K_D": [b, t, h, kv, d], "layouts": layouts}
            timed_row(row, functools.partial(splash.splash_attention, causal=True), qkv, ROWS)
        splash.LAYOUTS.pop(d)


def fastest(shape):
    """The (q, k, v) layouts of the fastest row of ``shape`` in $OUT's rows."""
    with open(os.path.join(os.environ["OUT"], ROWS)) as f:
        rows = [json.loads(line) for line in f]
    return tuple(min((r for r in rows if r["shape"] == shape and "ms" in r), key=lambda r: r["ms"])["layouts"])


def row(shape, args):
    d = SHAPES[shape][-1]
    splash.LAYOUTS[d] = fastest(shape)
    print(f"splash_layouts.py: head dim {d} read as q, k, v = {splash.LAYOUTS[d]}", flush=True)
    from zoo.cli.main import main as zoo_main

    return zoo_main(["bench", "step", *args])


if __name__ == "__main__":
    if sys.argv[1:2] == ["row"]:
        shape, separator, *rest = sys.argv[2:]
        assert separator == "--", "usage: splash_layouts.py row SHAPE -- ZOO_BENCH_STEP_ARGS"
        sys.exit(row(shape, rest))
    measure()
