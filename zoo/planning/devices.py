"""The accelerators a plan is sized for: peak FLOP/s, memory, and the links between devices.

One row per kind, per JAX device (a GPU, or a TPU chip: v4 and later expose one JAX device
per chip). The figures are the vendors' datasheet numbers, rounded; a roofline built
on them is an estimate (docs/planning.md lists its known errors):

- ``peak_flops``: dense bf16 FLOP/s, the same table MFU uses (``zoo.training.mfu.PEAK_FLOPS``).
- ``memory_gib``: HBM per device as sold (80 GB is written 80; JAX on a GPU preallocates
  75% of it unless ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise).
- ``hbm_bandwidth``: bytes/s between HBM and the cores.
- ``link_bandwidth``: bytes/s one device sends in one direction over the fast interconnect
  a mesh axis uses when it stays inside ``link_domain`` devices: NVLink through the
  NVSwitch (H100/H200 900 GB/s both ways = 450 GB/s each way; A100 300; B200 900), or a
  TPU's ICI where an axis maps onto one torus dimension and its ring runs both ways round
  the wraparound (2 links x one-way per link: v4/v5e 2 x 45 GB/s, v5p/v6e 2 x 90 GB/s).
- ``network_bandwidth``: bytes/s per device once an axis leaves the fast domain: one
  400 Gb/s InfiniBand NIC per GPU (A100 systems: 200 Gb/s); TPUs are taken to stay in one
  ICI slice (multi-slice DCN is not modelled), so theirs is the ICI figure.
- ``link_domain``: devices joined by the fast links: 8 GPUs of an HGX board; a TPU slice
  (None: all of them).
- ``collective_latency_s``: fixed cost of starting one collective (NCCL ~10 us; ICI ~5 us).

Sources: NVIDIA's H100, H200, A100 and HGX B200 datasheets; Google Cloud's TPU v4, v5e,
v5p and v6e system-architecture pages and the JAX scaling book's chip table ("How to
Think About TPUs"): HBM and ICI figures.
"""

import dataclasses
import os

from zoo.training.mfu import PEAK_FLOPS

__all__ = ["DEVICES", "DeviceSpec", "UnknownDeviceError", "device_spec", "host_cpu_spec", "local_device"]

GB = 1e9


class UnknownDeviceError(ValueError):
    """A device kind the table does not list; the message lists those it does."""


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One accelerator kind, per JAX device (see the module docstring for each field)."""

    name: str  # the table's key, e.g. "h100"
    description: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_gib: float
    hbm_bandwidth: float  # bytes/s
    link_bandwidth: float  # bytes/s per device per direction inside link_domain
    network_bandwidth: float  # bytes/s per device per direction across link domains
    link_domain: int | None  # devices joined by the fast links; None: every device
    collective_latency_s: float

    @property
    def memory_bytes(self):
        return int(self.memory_gib * 2**30)


def _gpu(name, description, peak, memory_gib, hbm_tb, nvlink_gb, network_gbit):
    return DeviceSpec(name, description, peak, memory_gib, hbm_tb * 1e12, nvlink_gb * GB, network_gbit / 8 * GB, 8, 10e-6)


def _tpu(name, description, peak, memory_gib, hbm_tb, ici_link_gb):
    link = 2 * ici_link_gb * GB  # both directions round the torus ring
    return DeviceSpec(name, description, peak, memory_gib, hbm_tb * 1e12, link, link, None, 5e-6)


DEVICES = {
    spec.name: spec
    for spec in (
        _gpu("h100", "NVIDIA H100 SXM 80 GB, HGX board of 8 (NVLink 4)", PEAK_FLOPS["H100 SXM"], 80, 3.35, 450, 400),
        _gpu("h200", "NVIDIA H200 SXM 141 GB, HGX board of 8 (NVLink 4)", PEAK_FLOPS["H200 SXM"], 141, 4.8, 450, 400),
        _gpu("a100", "NVIDIA A100 SXM 80 GB, HGX board of 8 (NVLink 3)", PEAK_FLOPS["A100"], 80, 2.04, 300, 200),
        _gpu("b200", "NVIDIA B200 180 GB, HGX board of 8 (NVLink 5)", PEAK_FLOPS["B200"], 180, 7.7, 900, 400),
        _tpu("tpu-v4", "Google TPU v4 chip, 32 GiB, 3D torus", PEAK_FLOPS["TPU v4"], 32, 1.2, 45),
        _tpu("tpu-v5e", "Google TPU v5e chip, 16 GiB, 2D torus", PEAK_FLOPS["TPU v5e"], 16, 0.81, 45),
        _tpu("tpu-v5p", "Google TPU v5p chip, 95 GiB, 3D torus", PEAK_FLOPS["TPU v5p"], 95, 2.76, 90),
        _tpu("tpu-v6e", "Google TPU v6e (Trillium) chip, 32 GiB, 2D torus", PEAK_FLOPS["TPU v6e"], 32, 1.64, 90),
    )
}

# Other spellings users type: "H100", "v5e", "tpu v5e", "TPU v5 lite".
_ALIASES = {"tpu-v5-lite": "tpu-v5e", "tpu-v6-lite": "tpu-v6e", "trillium": "tpu-v6e"}


def device_spec(name):
    """The ``DeviceSpec`` named ``name`` (case, spaces and a missing ``tpu-`` forgiven)."""
    if isinstance(name, DeviceSpec):
        return name
    key = "-".join(str(name).lower().replace("_", " ").split())
    key = _ALIASES.get(key, key)
    for candidate in (key, f"tpu-{key}", key.removesuffix("-sxm")):
        if candidate in DEVICES:
            return DEVICES[candidate]
    if key == "cpu":
        return host_cpu_spec()
    raise UnknownDeviceError(f"unknown device {name!r}; known: {', '.join(DEVICES)} (and cpu)")


def host_cpu_spec(devices=8):
    """This host's CPU split into ``devices`` simulated devices: its memory shared equally,
    nominal speeds (a plan for a CPU run sizes memory; its times mean little)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceSpec("cpu", f"this host's CPU as {devices} simulated devices", 1e11, memory / devices / 2**30, 20 * GB, 10 * GB, 10 * GB, None, 50e-6)


# ``jax.devices()[0].device_kind`` (lower-cased) -> DEVICES name; the first match wins.
_KINDS = (
    ("h200", "h200"), ("h100", "h100"), ("gh200", "h100"), ("a100", "a100"), ("b200", "b200"),
    ("tpu v4", "tpu-v4"), ("tpu v5 lite", "tpu-v5e"), ("tpu v5e", "tpu-v5e"), ("tpu v5", "tpu-v5p"),
    ("tpu v6", "tpu-v6e"),
)  # fmt: skip


def local_device():
    """``(DEVICES name, memory GiB or None)`` of this process' first device: what a plan
    made for a run here (``zoo train gpt --layout auto``) is sized for. The memory is
    what JAX may use (its ``bytes_limit``: on a GPU, 75% of the HBM unless
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise), where the backend reports it."""
    import jax

    devices = jax.devices()
    if devices[0].platform == "cpu":
        return "cpu", host_cpu_spec(len(devices)).memory_gib
    kind = devices[0].device_kind.lower()
    name = next((name for pattern, name in _KINDS if pattern in kind), None)
    if name is None:
        raise UnknownDeviceError(f"device kind {devices[0].device_kind!r} is not in zoo.planning.DEVICES; plan with --device")
    stats = devices[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return name, (limit / 2**30 if limit else None)


def platform_of(kind):
    """"cpu", "tpu" or "gpu": the JAX platform of a device kind (a ``DEVICES`` name or cpu)."""
    name = device_spec(kind).name
    return "cpu" if name == "cpu" else "tpu" if name.startswith("tpu") else "gpu"
