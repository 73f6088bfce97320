"""Device set-up for the command line, run before JAX starts: the ``--simulate-devices``
flag (added while parsing, so nothing heavy is imported here at module level) and
``prepare_devices``."""

import argparse
import os
import re

from zoo.config import types

DEFAULT_SIMULATED_DEVICES = 8
SIMULATE_HELP = "split the CPU into N devices (default on a CPU-only host: 8)"


def add_simulate_flag(parser):
    """``--simulate-devices N`` (read before JAX starts); a parser that has it keeps it."""
    try:
        parser.add_argument(
            "--simulate-devices", type=types.device_count, default=None, metavar="N", help=SIMULATE_HELP
        )
    except argparse.ArgumentError:  # already there
        pass


def prepare_devices(requested):
    """Simulate CPU devices as asked, or 8 on a CPU-only host; returns a line saying what was done.

    Args:
        requested: the ``--simulate-devices`` value, or None.
    """
    from zoo.distribution.devices import (
        accelerator_plugin_installed,
        backends_started,
        simulate_cpu_devices,
    )

    if requested is not None:
        simulate_cpu_devices(requested)
        return f"Simulating {requested} CPU devices (--simulate-devices {requested})."
    from_flags = _device_count_in_xla_flags()
    if from_flags is not None:
        return f"Using {from_flags} simulated CPU devices from XLA_FLAGS."
    if accelerator_plugin_installed() or backends_started():
        return None
    simulate_cpu_devices(DEFAULT_SIMULATED_DEVICES)
    return (
        f"No GPU/TPU backend found: simulating {DEFAULT_SIMULATED_DEVICES} CPU devices "
        f"(change with --simulate-devices N)."
    )


def _device_count_in_xla_flags():
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else None
