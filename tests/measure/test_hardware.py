"""The one hardware table: JAX device kinds matched once, for MFU and for the planner."""

import types

import jax
import pytest

from zoo.measure import hardware


@pytest.mark.parametrize(
    "device_kind, planned",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA GH200 480GB", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b200"),
        ("TPU v4", "tpu-v4"),
        ("TPU v5 lite", "tpu-v5e"),
        ("TPU v5", "tpu-v5p"),
        ("TPU v6 lite", "tpu-v6e"),
    ],
)
def test_local_device_sizes_a_plan_by_the_matched_kind(monkeypatch, device_kind, planned):
    device = types.SimpleNamespace(
        platform="gpu", device_kind=device_kind, memory_stats=lambda: {"bytes_limit": 60 * 2**30}
    )
    monkeypatch.setattr(jax, "devices", lambda: [device])
    assert hardware.local_device() == (planned, 60.0)


def test_a_kind_with_a_peak_but_no_planner_row_is_refused(monkeypatch):
    device = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA L4", memory_stats=lambda: {})
    monkeypatch.setattr(jax, "devices", lambda: [device])
    assert hardware.match_device_kind("NVIDIA L4") == "L4"
    with pytest.raises(
        hardware.UnknownDeviceError, match="device kind 'NVIDIA L4' is not in zoo.planning.DEVICES; plan with --device"
    ):
        hardware.local_device()


def test_training_and_planning_share_the_table():
    import zoo.planning
    from zoo.measure import mfu

    assert mfu.PEAK_FLOPS is hardware.PEAK_FLOPS and zoo.planning.DEVICES is hardware.DEVICES
    assert mfu.UnknownDeviceError is zoo.planning.UnknownDeviceError is hardware.UnknownDeviceError
