"""Measurement that training, planning, the benchmarks and ``zoo comms`` share.

``hardware``: the one hardware table, peak FLOP/s (``PEAK_FLOPS``) and the planner's
device rows (``DEVICES``: memory, interconnect), the one ``device_kind`` matcher and
``UnknownDeviceError``. ``hlo``: the collectives (with loop trip counts) and memory of a
compiled program, read from its optimised HLO. ``steps``: the one hand-written train
step (Keras' ``train_step`` without metrics). ``comms_report``: a layer's pass or a train
step compiled and read. ``compiled_step``: the exact step ``fit`` runs, compiled from an
abstract model, with its memory by part. ``mfu``: FLOPs per token and model-FLOPs
utilisation. Byte units and ``format_bytes`` are ``zoo.units``, below every package.

The package sits above ``zoo.models`` and below the jobs (``zoo.training``,
``zoo.planning``, ``zoo.bench``, ``zoo.cli``): tests/test_architecture.py. Importing it
loads the hardware table only (pure Python); the other modules load JAX and Keras.
"""

from zoo.measure.hardware import DEVICES, PEAK_FLOPS, DeviceSpec, UnknownDeviceError, device_spec, match_device_kind

__all__ = ["DEVICES", "PEAK_FLOPS", "DeviceSpec", "UnknownDeviceError", "device_spec", "match_device_kind"]
