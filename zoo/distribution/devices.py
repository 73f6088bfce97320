"""Simulated CPU devices, so data/model/sequence parallelism runs on a laptop or in CI.

XLA can split the host CPU into N devices. The count is fixed when JAX starts its
backends (the first ``jax.devices()`` or first computation), so ``simulate_cpu_devices``
must run before that; afterwards it only checks that the running count agrees.
"""

import importlib.util
import os

import jax

from zoo._compat import jax_backends_initialized
from zoo.config.types import MAX_DEVICES

# Python packages that bring a non-CPU JAX backend with them.
ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "libtpu")


class DeviceCountError(RuntimeError):
    """JAX already started with a device count other than the one asked for."""


def backends_started():
    """True once JAX has initialised its backends (device counts are then fixed)."""
    return jax_backends_initialized()


def simulate_cpu_devices(count):
    """Split the host CPU into ``count`` XLA devices.

    Must be called before JAX initialises (before any ``jax.devices()`` call or
    array computation). Calling it again with the count already in force is a no-op.

    Raises:
        ValueError: ``count`` is not a positive integer.
        DeviceCountError: JAX already started with a different number of CPU devices.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"simulated device count must be a positive integer, got {count!r}")
    if count > MAX_DEVICES:
        raise ValueError(
            f"simulated device count {count:,} is above the {MAX_DEVICES:,} this zoo simulates (zoo.config.types.MAX_DEVICES)"
        )
    if backends_started():
        _check_running_cpu_count(count)
        return
    jax.config.update("jax_num_cpu_devices", count)
    # Subprocesses (and older JAX versions) read the XLA flag instead.
    os.environ["XLA_FLAGS"] = simulation_xla_flags(os.environ.get("XLA_FLAGS", ""), count)


def _check_running_cpu_count(count):
    running = len(jax.devices("cpu"))
    if running != count:
        raise DeviceCountError(
            f"JAX already started with {running} CPU device(s); cannot switch to "
            f"{count}. Call simulate_cpu_devices({count}) (or pass "
            f"--simulate-devices {count}) before anything touches jax.devices(), "
            f"or set XLA_FLAGS=--xla_force_host_platform_device_count={count} "
            f"before starting Python."
        )


# N simulated devices share the host's cores; on a busy 2-core machine one device can
# reach a collective long after the others. XLA:CPU aborts a rendezvous after 40 s by
# default; allow 2 minutes, but no more: XLA:CPU can also truly deadlock when many
# sharded computations are queued without waiting (see docs/distribution.md), and that
# should fail, not hang.
COLLECTIVE_TIMEOUT_FLAGS = (
    "--xla_cpu_collective_timeout_seconds=120",
    "--xla_cpu_collective_call_terminate_timeout_seconds=120",
)


def simulation_xla_flags(flags, count):
    """``flags`` with the device count set to ``count`` and long CPU collective timeouts."""
    ours = ("--xla_force_host_platform_device_count",) + tuple(f.split("=")[0] for f in COLLECTIVE_TIMEOUT_FLAGS)
    kept = [f for f in flags.split() if not f.startswith(ours)]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={count}", *COLLECTIVE_TIMEOUT_FLAGS])


def accelerator_plugin_installed():
    """Whether a GPU/TPU JAX plugin is importable, checked without starting JAX."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and set(platforms.split(",")) <= {"cpu"}:
        return False
    return any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_PLUGINS)


def describe_devices():
    """One line naming the platform and count of the devices JAX sees."""
    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    return f"{len(devices)} x {'/'.join(kinds)} ({devices[0].platform})"
