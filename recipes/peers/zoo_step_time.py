"""The zoo's fit step time per layout on the side-by-side timing model, 8 simulated CPU devices.

    python recipes/peers/zoo_step_time.py [LAYOUT,LAYOUT...]   (default fsdp,tp)

The model MaxText runs in maxtext_step_time.sh: C=512, 4 layers, 8/4 heads of 64, F=2048,
V=32,000 tied, T=512, global batch 8, remat full, mixed_bfloat16, AdamW with clipping
(the training job's compile). Each layout is compiled and run once, then the layouts
alternate ``REPEATS`` times (environment, default 3) over one 3-step epoch; the medians
of wall and process CPU time per step are printed. ``REMAT`` and ``POLICY`` (environment)
override remat and the dtype policy. docs/performance.md holds the figures.
"""

import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

from zoo import distribution as zd  # noqa: E402
from zoo.bench.peers import TIMING_MODEL  # noqa: E402
from zoo.models import GPTCausalLM  # noqa: E402
from zoo.models.gpt.gpt_backbone import GPTBackbone  # noqa: E402
from zoo.training.gpt import compile_gpt  # noqa: E402

ARGUMENTS = TIMING_MODEL | {"remat": os.environ.get("REMAT", "full")}  # zoo bench peers' timing model
MESHES = {"fsdp": "data=8", "tp": "data=2,model=4", "fsdp+tp": "data=2,model=4"}
LENGTH, BATCH, STEPS = 512, 8, 3


def build(layout):
    distribution = zd.distribution_for(GPTCausalLM, layout, MESHES[layout], config=ARGUMENTS)
    with distribution.scope():
        keras.utils.set_random_seed(0)
        model = GPTCausalLM(backbone=GPTBackbone(**ARGUMENTS))
        compile_gpt(model, learning_rate=1e-4, total_steps=100)
    return distribution, model


def epoch_times(distribution, model, x, y):
    """(wall s, process CPU s) of one fit epoch of STEPS steps."""
    with distribution.scope():
        cpu, wall = time.process_time(), time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        return time.perf_counter() - wall, time.process_time() - cpu


def main(layouts):
    keras.config.set_dtype_policy(os.environ.get("POLICY", "mixed_bfloat16"))
    tokens = np.random.default_rng(0).integers(0, ARGUMENTS["vocabulary_size"], (BATCH * STEPS, LENGTH), np.int32)
    targets = np.roll(tokens, -1, axis=1)
    runs = {layout: build(layout) for layout in layouts}
    for distribution, model in runs.values():  # compile, and one warm epoch
        epoch_times(distribution, model, tokens, targets)
    times = {layout: [] for layout in layouts}
    for _ in range(int(os.environ.get("REPEATS", 3))):
        for layout, (distribution, model) in runs.items():
            times[layout].append(epoch_times(distribution, model, tokens, targets))
    for layout, samples in times.items():
        wall = statistics.median(w for w, _ in samples) / STEPS
        cpu = statistics.median(c for _, c in samples) / STEPS
        print(f"{layout}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU")


if __name__ == "__main__":
    import sys

    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["fsdp", "tp"])
