"""An experiment, not library code: what splash's forward loses by its float32 P.V product.

    source .device/tpu-env.sh
    OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_pv_dtype.py
    OUT=/tmp/out python3 recipes/tpu-v5e-1/splash_pv_dtype.py row -- --config-name gpt_1b --num-layers 8 --batch-size 2

JAX's splash forward kernel (JAX 0.10 and 0.12 alike) casts each V block to float32 and
multiplies the float32 probabilities by it: ``o_curr = dot(s_curr, v.astype(float32))``,
a float32 matmul on the TPU's bf16 matrix unit. Its fused backward multiplies
``p.astype(do.dtype)`` (bfloat16) instead, as flash attention does. This script builds a
copy of JAX's module in which the forward's product is ``dot(s_curr.astype(v.dtype), v)``
with a float32 accumulator (the one line below), then times the library's
``splash_attention`` forward + backward both ways at splash_blocks.py's shapes (the median
of 5 timings of 5 calls, one JSON line a row in $OUT/splash_pv_dtype.jsonl); the ``row`` form
runs ``zoo bench step`` in this process with the copy in place of JAX's module. The copy is
made in memory from the installed file, for this measurement only; nothing is written.
"""

import functools
import importlib.util
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
import jax.experimental.pallas.ops.tpu.splash_attention as package  # noqa: E402
import jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel as original  # noqa: E402
from splash_blocks import SHAPES, inputs, timed_row  # noqa: E402  (this folder)

import zoo.kernels.splash_attention as splash  # noqa: E402

FLOAT32_PV = "    v = v.astype(float32)\n    o_curr = lax.dot_general(s_curr, v, sv_dims)\n"
BF16_PV = "    o_curr = lax.dot_general(s_curr.astype(v.dtype), v, sv_dims, preferred_element_type=float32)\n"
ROWS = "splash_pv_dtype.jsonl"


def bf16_pv_module():
    """JAX's splash kernel module with the forward's P.V product in V's dtype (the docstring)."""
    with open(original.__file__) as f:
        source = f.read()
    assert source.count(FLOAT32_PV) == 1, "this JAX's splash forward is not the one this experiment patches"
    spec = importlib.util.spec_from_loader(original.__name__, loader=None, origin=original.__file__)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source.replace(FLOAT32_PV, BF16_PV), original.__file__, "exec"), module.__dict__)
    return module


def use(module):
    """Make ``from ...splash_attention import splash_attention_kernel`` give ``module``."""
    sys.modules[original.__name__] = module
    package.splash_attention_kernel = module
    splash._kernel.cache_clear()


def measure():
    patched = bf16_pv_module()
    for name, (b, t, h, kv, d) in SHAPES.items():
        qkv = inputs(b, t, h, kv, d)
        for label, module in (("float32 P.V (JAX's)", original), ("bfloat16 P.V", patched)):
            use(module)
            row = {"shape": name, "B_T_H_K_D": [b, t, h, kv, d], "pv": label}
            timed_row(row, functools.partial(splash.splash_attention, causal=True), qkv, ROWS)
    use(original)


def row(args):
    use(bf16_pv_module())
    print("splash_pv_dtype.py: splash's forward P.V product in bfloat16 (a copy of JAX's module)", flush=True)
    from zoo.cli.main import main as zoo_main

    return zoo_main(["bench", "step", *args])


if __name__ == "__main__":
    if sys.argv[1:2] == ["row"]:
        separator, *rest = sys.argv[2:]
        assert separator == "--", "usage: splash_pv_dtype.py row -- ZOO_BENCH_STEP_ARGS"
        sys.exit(row(rest))
    measure()
