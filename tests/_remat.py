"""Whether XLA:CPU's memory analysis shows remat, asked where XLA's own flags hold.

``zoo.measure.compiled_step.memory_analysis_reflects_remat`` answers for the process it
runs in; in a test process the suite's XLA flags (tests/conftest.py) turn XLA:CPU's
concurrency-optimized scheduler off, with which the memory analysis shows remat only in
part (its probe: 584 -> 304 MiB of temporaries, against 616 -> 136 with the scheduler on,
JAX 0.12), so the probe says no on JAX 0.12 too. This asks a fresh process with XLA's
own flags, once per test process.
"""

import functools
import os
import subprocess
import sys

PROBE = "from zoo.measure.compiled_step import memory_analysis_reflects_remat as f; print(f())"


@functools.cache
def remat_shows_in_memory_analysis():
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return done.stdout.split()[-1] == "True"
