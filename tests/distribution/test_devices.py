import os
import subprocess
import sys

import jax
import pytest

from zoo.distribution import DeviceCountError, simulate_cpu_devices


def test_same_count_after_start_is_a_no_op():
    assert len(jax.devices()) == 8
    simulate_cpu_devices(8)
    assert len(jax.devices()) == 8


def test_different_count_after_start_names_both_counts():
    jax.devices()
    with pytest.raises(DeviceCountError, match=r"already started with 8 CPU device\(s\); cannot switch to 4"):
        simulate_cpu_devices(4)


@pytest.mark.parametrize("count", [0, -2, 2.5, True, "8"])
def test_bad_count(count):
    with pytest.raises(ValueError, match="positive integer"):
        simulate_cpu_devices(count)


def test_simulation_before_jax_starts_in_a_fresh_process():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    code = "import zoo, jax; from zoo.distribution import simulate_cpu_devices; simulate_cpu_devices(3); print(len(jax.devices()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "3"
