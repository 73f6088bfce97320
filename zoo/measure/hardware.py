"""The accelerators the zoo measures and plans for: peak FLOP/s, memory, the links between devices.

One home for the hardware figures (training's MFU and the planner both read them here):

- ``PEAK_FLOPS``: dense bf16 FLOP/s per JAX device, every kind MFU knows (``"H100 SXM"``,
  ``"TPU v5e"``, ...), from the vendors' datasheets.
- ``DEVICES``: the kinds a plan is sized for (``DeviceSpec``: ``PEAK_FLOPS``' figure, memory
  and interconnect), keyed by the names users type (``"h100"``, ``"tpu-v5e"``).
- ``DEVICE_KINDS`` / ``match_device_kind``: the one matcher from JAX's ``device_kind``
  (``"NVIDIA H100 80GB HBM3"``, ``"TPU v5 lite"``) to a ``PEAK_FLOPS`` key; ``local_device``
  goes on from there to the ``DEVICES`` row.
- ``UnknownDeviceError``: a kind or name neither table lists.

One ``DEVICES`` row per kind, per JAX device (a GPU, or a TPU chip: v4 and later expose
one JAX device per chip). The figures are the vendors' datasheet numbers, rounded; a roofline built
on them is an estimate (docs/planning.md lists its known errors):

- ``peak_flops``: dense bf16 FLOP/s, the ``PEAK_FLOPS`` entry of the kind.
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
import re

from zoo.units import GIB

__all__ = [
    "DEVICES",
    "DEVICE_KINDS",
    "PEAK_FLOPS",
    "DeviceSpec",
    "UnknownDeviceError",
    "device_spec",
    "host_cpu_spec",
    "local_device",
    "match_device_kind",
    "memory_limit",
    "platform_of",
]

GB = 1e9

# Dense (no sparsity) bf16 peak FLOP/s per JAX device, from the vendors' datasheets
# (where a datasheet gives only the 2:4-sparsity figure, it is halved).
PEAK_FLOPS = {
    # https://www.nvidia.com/en-us/data-center/h100/ (datasheet: BF16 1,979 TFLOPS with sparsity)
    "H100 SXM": 989e12,
    "H100 PCIe": 756e12,  # same datasheet: 1,513 TFLOPS with sparsity
    "H100 NVL": 835e12,  # same datasheet: 1,671 TFLOPS with sparsity
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 1,979 with sparsity; NVL: 1,671)
    "H200 SXM": 989e12,
    "H200 NVL": 835e12,
    # https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (the H100 of a GH200)
    "GH200": 989e12,
    # https://www.nvidia.com/en-us/data-center/a100/ (40 GB and 80 GB, SXM and PCIe: 312 dense)
    "A100": 312e12,
    # https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200: 36 PFLOPS sparse for 8 GPUs)
    "B200": 2250e12,
    # https://www.nvidia.com/en-us/data-center/l4/ (BF16 242 TFLOPS with sparsity)
    "L4": 121e12,
    # https://cloud.google.com/tpu/docs/v3: 123 TFLOPS per chip; a JAX device is one of its 2 cores
    "TPU v3": 61.5e12,
    # https://cloud.google.com/tpu/docs/v4 (per chip; a JAX device is a chip)
    "TPU v4": 275e12,
    # https://cloud.google.com/tpu/docs/v5e
    "TPU v5e": 197e12,
    # https://cloud.google.com/tpu/docs/v5p
    "TPU v5p": 459e12,
    # https://cloud.google.com/tpu/docs/v6e (Trillium)
    "TPU v6e": 918e12,
}

# ``jax.devices()[0].device_kind`` (lower-cased) -> PEAK_FLOPS key; the first match wins.
DEVICE_KINDS = (
    (r"gh200", "GH200"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h100.*nvl", "H100 NVL"),
    (r"h100", "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (r"h200.*nvl", "H200 NVL"),
    (r"h200", "H200 SXM"),  # "NVIDIA H200"
    (r"a100", "A100"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    (r"b200", "B200"),
    (r"\bl4\b", "L4"),
    (r"^tpu v3", "TPU v3"),
    (r"^tpu v4$", "TPU v4"),
    (r"^tpu v5( lite|e)$", "TPU v5e"),
    (r"^tpu v5p?$", "TPU v5p"),
    (r"^tpu v6( lite|e)$", "TPU v6e"),
)


class UnknownDeviceError(ValueError):
    """A device kind or name the tables do not list; the message says what to do instead."""


def match_device_kind(device_kind):
    """The ``PEAK_FLOPS`` key of a JAX ``device_kind`` (``"NVIDIA H200"`` -> ``"H200 SXM"``), or None."""
    kind = str(device_kind).strip().lower()
    return next((name for pattern, name in DEVICE_KINDS if re.search(pattern, kind)), None)


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
        return int(self.memory_gib * GIB)


def _gpu(name, description, peak, memory_gib, hbm_tb, nvlink_gb, network_gbit):
    return DeviceSpec(
        name, description, peak, memory_gib, hbm_tb * 1e12, nvlink_gb * GB, network_gbit / 8 * GB, 8, 10e-6
    )


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
        # v5e: 16 GiB of HBM, of which JAX may use 15.75 (bytes_limit 16,909,336,064 on the chip, JAX 0.10.2)
        _tpu("tpu-v5e", "Google TPU v5e chip, 16 GiB (15.75 usable), 2D torus", PEAK_FLOPS["TPU v5e"], 15.75, 0.81, 45),
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
    return DeviceSpec(
        "cpu",
        f"this host's CPU as {devices} simulated devices",
        1e11,
        memory / devices / GIB,
        20 * GB,
        10 * GB,
        10 * GB,
        None,
        50e-6,
    )


# ``match_device_kind``'s PEAK_FLOPS key -> the DEVICES row a plan for it is sized by (L4 and TPU v3: none).
_PLANNED = {
    "H100 SXM": "h100",
    "H100 PCIe": "h100",
    "H100 NVL": "h100",
    "GH200": "h100",
    "H200 SXM": "h200",
    "H200 NVL": "h200",
    "A100": "a100",
    "B200": "b200",
    "TPU v4": "tpu-v4",
    "TPU v5e": "tpu-v5e",
    "TPU v5p": "tpu-v5p",
    "TPU v6e": "tpu-v6e",
}


def local_device():
    """``(DEVICES name, memory GiB or None)`` of this process' first device: what a plan
    made for a run here (``zoo train gpt --layout auto``) is sized for. The memory is
    what JAX may use (its ``bytes_limit``: on a GPU, 75% of the HBM unless
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise), where the backend reports it."""
    import jax

    devices = jax.devices()
    if devices[0].platform == "cpu":
        return "cpu", host_cpu_spec(len(devices)).memory_gib
    name = _PLANNED.get(match_device_kind(devices[0].device_kind))
    if name is None:
        raise UnknownDeviceError(
            f"device kind {devices[0].device_kind!r} is not in zoo.planning.DEVICES; plan with --device"
        )
    limit = memory_limit(devices[0])
    return name, (limit / GIB if limit else None)


def memory_limit(device):
    """The bytes JAX may use on ``device`` (its ``bytes_limit``), or None where the backend
    reports none."""
    return (device.memory_stats() or {}).get("bytes_limit")


def platform_of(kind):
    """ "cpu", "tpu" or "gpu": the JAX platform of a device kind (a ``DEVICES`` name or cpu)."""
    name = device_spec(kind).name
    return "cpu" if name == "cpu" else "tpu" if name.startswith("tpu") else "gpu"
