"""Which of the device's memory counters sees a program's temporaries, and whether a step that
runs out of memory at run time keeps its donated arguments (issue 43: the HBM peak measured).

`zoo bench step`'s rows read `peak_bytes_in_use` 2.86 GiB for steps whose compiled
footprints are 4.5-6.3 GiB. This script runs, on the first device:

1. a jitted program whose temporaries are about 2 GiB (a (16,384 x 16,384) float32 matmul
   output, read back by a reduction), printing every counter before and after;
2. the same program with its argument donated while a filler array holds all but 1 GiB of
   the free memory, so that its temporaries cannot be allocated: what error it raises and
   whether the donated argument is still readable afterwards.

    source .device/tpu-env.sh && python3 recipes/tpu-v5e-1/memory_counters.py
"""

import functools

import jax
import jax.numpy as jnp

GIB = 2**30


def counters(label):
    stats = jax.devices()[0].memory_stats() or {}
    print(
        f"{label}: "
        + ", ".join(
            f"{key} {value / GIB:.3f} GiB" if isinstance(value, int) and value > 2**20 else f"{key} {value}"
            for key, value in sorted(stats.items())
        ),
        flush=True,
    )
    return stats


@functools.partial(jax.jit, donate_argnums=())
def big_temporary(x):  # f32[16384, 128] -> scalar, through an f32[16384, 16384] (1 GiB) product
    full = x @ x.T  # (16384, 16384) f32: 1 GiB
    return jnp.sum(jnp.tanh(full) * full.T)


@functools.partial(jax.jit, donate_argnums=0)
def big_temporary_donated(x):
    full = x @ x.T
    return x + jnp.sum(jnp.tanh(full) * full.T)


def main():
    x = jax.random.normal(jax.random.key(0), (16384, 128), jnp.float32)
    x.block_until_ready()
    before = counters("before")
    compiled = big_temporary.lower(x).compile()
    analysis = compiled.memory_analysis()
    print(f"compiled temporaries {analysis.temp_size_in_bytes / GIB:.3f} GiB", flush=True)
    jax.block_until_ready(big_temporary(x))
    after = counters("after one run")
    for key in sorted(after):
        if isinstance(after[key], int) and isinstance(before.get(key), int) and after[key] != before[key]:
            print(f"  {key} moved by {(after[key] - before[key]) / GIB:+.3f} GiB", flush=True)

    if "bytes_limit" not in after:
        print("this backend keeps no memory counters (CPU): nothing more to show", flush=True)
        return
    free = after["bytes_limit"] - after["bytes_in_use"]
    filler = jnp.zeros(((free - GIB) // 4,), jnp.float32)
    filler.block_until_ready()
    counters("with the filler")
    try:
        jax.block_until_ready(big_temporary_donated(x))
        print("donated run: ran (the temporaries fitted beside the filler)", flush=True)
    except Exception as error:  # what a step that does not fit raises at run time
        print(f"donated run: {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)
    print(f"donated argument deleted afterwards: {x.is_deleted()}", flush=True)
    if not x.is_deleted():
        try:
            print(f"donated argument still readable: sum {float(jnp.sum(x)):.3f}", flush=True)
        except Exception as error:
            print(f"donated argument not readable: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    del filler
    counters("filler freed")


if __name__ == "__main__":
    main()
