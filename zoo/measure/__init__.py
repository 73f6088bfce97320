"""Measurement that training, planning and the benchmarks share.

``zoo.measure.hardware``: the one hardware table, peak FLOP/s (``PEAK_FLOPS``) and the
planner's device rows (``DEVICES``: memory, interconnect), the one ``device_kind``
matcher and ``UnknownDeviceError``. Byte units and ``format_bytes`` are ``zoo.units``,
below every package. This package sits low in the import order: pure Python (JAX only
inside functions), importing no zoo package but ``zoo.units`` (tests/test_architecture.py).
"""

from zoo.measure.hardware import DEVICES, PEAK_FLOPS, DeviceSpec, UnknownDeviceError, device_spec, match_device_kind

__all__ = ["DEVICES", "PEAK_FLOPS", "DeviceSpec", "UnknownDeviceError", "device_spec", "match_device_kind"]
