"""One `zoo bench step` row with RoPE written another way (an experiment; the library is unchanged).

    source .device/tpu-env.sh
    python3 recipes/tpu-v5e-1/rope_row.py VARIANT -- --config-name gpt_350m --sequence-length 1024 --batch-size 8

VARIANT is one of attention_layouts.py's RoPE forms (rope_bf16, matmul_f32, matmul_bf16),
or ``best:SHAPE``: the fastest of them at that shape in $OUT/layouts.jsonl (written by
attention_layouts.py in the same call), e.g. ``best:gpt_350m b8``. The chosen form replaces
``zoo.layers.rotary_embedding.apply_rotary_embedding`` (every layer's ``Rope.apply`` looks it
up there at call time), then the rest of the arguments run as ``zoo bench step``.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
import attention_layouts  # noqa: E402  (this folder)

ROPES = {
    "rope_bf16": attention_layouts.rope_bf16,
    "matmul_f32": attention_layouts.rope_by_matmul(attention_layouts.jnp.float32),
    "matmul_bf16": attention_layouts.rope_by_matmul(attention_layouts.jnp.bfloat16),
}


def chosen(variant):
    """The RoPE form's name: ``variant`` itself, or the fastest of ROPES at ``best:SHAPE``."""
    if not variant.startswith("best:"):
        return variant
    shape = variant.removeprefix("best:")
    with open(os.path.join(os.environ["OUT"], "layouts.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return min((r for r in rows if r["shape"] == shape and r["variant"] in ROPES), key=lambda r: r["ms"])["variant"]


def main():
    variant, separator, *args = sys.argv[1:]
    assert separator == "--", "usage: rope_row.py VARIANT -- ZOO_BENCH_STEP_ARGS"
    name = chosen(variant)
    print(f"rope_row.py: RoPE as {name}", flush=True)
    import zoo.layers.rotary_embedding as rotary
    from zoo.cli.main import main as zoo_main

    rotary.apply_rotary_embedding = ROPES[name]
    return zoo_main(["bench", "step", *args])


if __name__ == "__main__":
    sys.exit(main())
