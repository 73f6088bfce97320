"""The device table, the roofline, loop FLOPs and depth extrapolation: no model compiled."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from zoo.measure.comms_report import FAST_COMPILE, loop_multiplicities
from zoo.measure.hardware import DEVICES, PEAK_FLOPS, UnknownDeviceError, device_spec
from zoo.planning import roofline
from zoo.planning.measure import StepMeasure, extrapolate, loop_dot_flops


@pytest.mark.parametrize(
    "name, expected",
    [("H100", "h100"), ("h200", "h200"), ("v5e", "tpu-v5e"), ("TPU v5 lite", "tpu-v5e"), ("tpu_v6e", "tpu-v6e")],
)
def test_device_names_users_type_resolve(name, expected):
    assert device_spec(name).name == expected


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(UnknownDeviceError, match="unknown device 'h300'; known: h100, h200, a100, b200, tpu-v4"):
        device_spec("h300")


def test_every_device_uses_the_mfu_peak_table():
    peaks = {
        "h100": "H100 SXM",
        "h200": "H200 SXM",
        "a100": "A100",
        "b200": "B200",
        "tpu-v4": "TPU v4",
        "tpu-v5e": "TPU v5e",
        "tpu-v5p": "TPU v5p",
        "tpu-v6e": "TPU v6e",
    }
    assert {name: spec.peak_flops for name, spec in DEVICES.items()} == {
        name: PEAK_FLOPS[key] for name, key in peaks.items()
    }


def test_an_axis_inside_the_board_uses_nvlink_and_one_across_boards_the_network():
    h100 = device_spec("h100")
    mesh = [("data", 2), ("model", 8)]  # model: 8 consecutive GPUs (one HGX board); data: across boards
    assert roofline.axes_bandwidth(("model",), mesh, h100) == 450e9
    assert roofline.axes_bandwidth(("data",), mesh, h100) == 50e9
    assert roofline.axes_bandwidth(("data", "model"), mesh, h100) == 50e9
    assert roofline.axes_bandwidth(("data",), [("data", 8)], h100) == 450e9
    tpu = device_spec("tpu-v5e")  # one ICI slice: every axis on ICI, both ways round the ring
    assert roofline.axes_bandwidth(("data",), [("data", 16), ("model", 16)], tpu) == 90e9


def test_step_time_is_the_roofline_plus_each_axis_collectives():
    h100 = device_spec("h100")
    rows = [
        {"axes": ("model",), "kind": "all-reduce", "count": 10, "sent_bytes": 4.5e9},
        {"axes": ("data",), "kind": "all-gather", "count": 2, "sent_bytes": 1e9},
        {"axes": (), "kind": "all-reduce", "count": 5, "sent_bytes": 0.0},  # over one device: free
    ]
    time = roofline.estimate_step_time(
        flops=989e12 * 0.5,
        bytes_accessed=3.35e12 * 0.1,
        collectives=rows,
        mesh_axes=[("data", 2), ("model", 8)],
        spec=h100,
    )
    assert time.compute_s == pytest.approx(0.5) and time.memory_s == pytest.approx(0.1)
    assert time.collective_s == pytest.approx({"model": 10 * 10e-6 + 0.01, "data": 2 * 10e-6 + 0.02})
    assert time.step_s == pytest.approx(0.5 + 0.03012)
    assert time.overlapped_s == pytest.approx(0.5) and time.bound == "compute"
    assert roofline.mfu(989e12 * 16 * 0.25, time.step_s, 16, h100) == pytest.approx(0.25 / 0.53012)


def test_dot_products_in_loops_are_counted_for_every_trip():
    """XLA's cost analysis counts a while body once; the planner adds the other trips."""

    def program(x, w):  # (64, 512) x (512, 256): two dots per trip, 10 trips
        return jax.lax.fori_loop(0, 10, lambda i, x: jnp.tanh((x @ w) @ w.T), x)

    x, w = jax.ShapeDtypeStruct((64, 512), jnp.float32), jax.ShapeDtypeStruct((512, 256), jnp.float32)
    compiled = jax.jit(program).lower(x, w).compile(FAST_COMPILE)
    text = compiled.as_text()
    analysis = compiled.cost_analysis()
    counted = (analysis[0] if isinstance(analysis, list) else analysis)["flops"]
    dots = 10 * 2 * (2 * 64 * 512 * 256)
    assert counted < dots / 5  # what XLA alone reports: one trip
    assert counted + loop_dot_flops(text, loop_multiplicities(text)[0]) == pytest.approx(dots, rel=0.01)


def _measure(layers, scale):
    return StepMeasure(
        num_layers=layers,
        mesh="data=8",
        batch_size=8,
        memory={
            "weights": 10 * scale,
            "gradients": 10 * scale,
            "optimizer": 20 * scale,
            "temp": 100 * scale + 7,
            "argument": 30 * scale,
            "output": 30 * scale,
            "alias": 30 * scale,
        },
        flops=1e9 * scale,
        bytes_accessed=1e6 * scale,
        collectives=[
            {
                "axes": ("data",),
                "kind": "all-gather",
                "count": 2 * scale,
                "bytes": 64 * scale,
                "sent_bytes": 56.0 * scale,
            }
        ],
        collectives_exact=True,
        compile_s=1.0,
    )


def test_extrapolation_is_linear_in_the_depth():
    step = extrapolate(_measure(1, 2), _measure(2, 3), 22)  # +1 per block from 3 at depth 2: 23 at 22
    assert step.num_layers == 22 and step.flops == pytest.approx(23e9)
    assert step.memory["temp"] == 2307 and step.memory["weights"] == 230
    assert step.collectives == [
        {"axes": ("data",), "kind": "all-gather", "count": 46, "bytes": 1472, "sent_bytes": 1288.0}
    ]
    wider = extrapolate(
        _measure(1, 2), dataclasses.replace(_measure(2, 3), num_layers=3), 21
    )  # 2 blocks apart (a pipeline's stages)
    assert (
        wider.memory["temp"] == 307 + 9 * 100 and wider.collectives[0]["count"] == 6 + 9 * 2
    )  # +100, +2 every 2 blocks
    with pytest.raises(ValueError, match="needs a deeper second step, got 2 and 1 blocks"):
        extrapolate(_measure(2, 3), _measure(1, 2), 22)


def test_a_gpu_link_domain_is_at_most_one_host_of_the_target():
    """32 H100s on 8 hosts of 4: a model axis of 4 stays on NVLink, one of 8 crosses hosts."""
    from zoo.planning.plan import PlanRequest, target_spec

    spec = target_spec(PlanRequest("pretrain_gpt", {}, devices=32, device="h100", hosts=8))
    assert (
        spec.link_domain == 4
        and target_spec(PlanRequest("pretrain_gpt", {}, devices=32, device="h100", hosts=4)).link_domain == 8
    )
    assert roofline.axes_bandwidth(("model",), [("data", 8), ("model", 4)], spec) == 450e9
    assert roofline.axes_bandwidth(("model",), [("data", 4), ("model", 8)], spec) == 50e9
    assert (
        target_spec(PlanRequest("pretrain_gpt", {}, devices=64, device="tpu-v5e", hosts=16)).link_domain is None
    )  # one ICI slice
