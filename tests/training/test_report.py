"""Step reports (time, throughput, MFU; process 0 only), config and mesh printouts, profiler traces."""

import dataclasses
import types

import keras
import numpy as np
import pytest

from zoo.distribution import make_mesh
from zoo.training import report as report_module
from zoo.training.profile import ProfileSteps
from zoo.training.report import StepReport, StepStats, format_config, format_mesh, format_stats, print_mesh

BATCH, STEPS, FEATURES = 8, 5, 4


def _fit(callbacks, steps=STEPS):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(steps * BATCH, FEATURES)).astype("float32")
    model.fit(x, x[:, :1], batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)


def test_step_report_numbers_follow_the_formulas():
    lines = []
    flops = 6 * (FEATURES * 8 + 8 * 1) * BATCH  # 6 * matmul weights * examples per step
    callback = StepReport(BATCH, unit="examples", flops_per_step=flops, peak_flops_per_device=1e9, num_devices=2, every=2, report=lines.append)
    _fit([callback])
    assert callback.first_step_s > 0
    assert [s.step for s in callback.stats] == [3, 5] and [s.steps for s in callback.stats] == [2, 2]
    for stats in callback.stats:
        assert stats.step_time_s > 0
        assert stats.items_per_s == pytest.approx(BATCH / stats.step_time_s)
        assert stats.items_per_s_per_device == pytest.approx(stats.items_per_s / 2)
        assert stats.mfu == pytest.approx(flops / stats.step_time_s / (2 * 1e9))
    assert lines[0].startswith("step 1: ") and lines[0].endswith("s (XLA compilation + first step)")
    assert lines[1:] == [format_stats(s, "examples") for s in callback.stats]
    assert "MFU" in lines[1]


def test_step_report_prints_only_on_process_zero(monkeypatch):
    monkeypatch.setattr(report_module, "is_primary", lambda: False)
    lines = []
    callback = StepReport(BATCH, every=1, report=lines.append)
    _fit([callback], steps=3)
    assert lines == []
    assert len(callback.stats) == 2 and all(s.mfu is None for s in callback.stats)  # measured all the same


def test_format_stats():
    stats = StepStats(step=20, steps=10, step_time_s=0.0123, items_per_s=1_234_567.4, items_per_s_per_device=154_320.9, mfu=0.4123)
    assert format_stats(stats) == "step 20: 12.3 ms/step, 1,234,567 tokens/s (154,321 tokens/s per device), MFU 41.2%"
    assert format_stats(dataclasses.replace(stats, mfu=None), "images").endswith("(154,321 images/s per device)")


@pytest.mark.parametrize("kwargs, message", [({"items_per_step": 0}, "items_per_step must be positive"), ({"items_per_step": 1, "every": 0}, "every must be a positive integer")])
def test_step_report_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StepReport(**kwargs)


def test_format_config():
    @dataclasses.dataclass
    class Config:
        strategy: str = "data"
        batch_size: int = 32

    assert format_config(Config()) == ["strategy    'data'", "batch_size  32"]


def test_format_mesh_on_one_process():
    assert format_mesh(make_mesh("data=2,model=4")) == [
        "mesh: data=2,model=4 over 8 x cpu (cpu), 1 process(es)",
        "  axis 'data' of size 2: within each process",
        "  axis 'model' of size 4: within each process",
    ]


def test_format_mesh_names_the_axis_that_crosses_processes():
    # The layout of a 2-process x 4-device job: row p of the mesh is process p's devices.
    devices = np.array([[types.SimpleNamespace(process_index=p, device_kind="NVIDIA H200", platform="gpu") for _ in range(4)] for p in range(2)])
    mesh = types.SimpleNamespace(backend_mesh=types.SimpleNamespace(devices=devices), axis_names=("data", "model"), shape=(2, 4))
    assert format_mesh(mesh)[1:] == ["  axis 'data' of size 2: crosses processes", "  axis 'model' of size 4: within each process"]


def test_print_mesh_of_a_distribution():
    lines = []
    print_mesh(keras.distribution.DataParallel(device_mesh=make_mesh("data=8")), report=lines.append)
    assert lines[0] == "distribution: DataParallel, batch split over 'data'"
    assert lines[1].startswith("mesh: data=8 over 8 x cpu")


def test_profile_writes_a_trace_of_the_chosen_steps(tmp_path):
    callback = ProfileSteps(tmp_path, start_step=1, num_steps=2)
    _fit([callback], steps=4)
    assert callback.traced_steps == [1, 2]
    traces = list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
    assert traces and all(t.stat().st_size > 0 for t in traces)


def test_profile_stops_when_training_ends_first(tmp_path):
    callback = ProfileSteps(tmp_path, start_step=2, num_steps=10)
    _fit([callback], steps=3)
    assert callback.traced_steps == [2]
    assert list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))


@pytest.mark.parametrize("kwargs, message", [({"start_step": -1}, "start_step must be a non-negative integer"), ({"num_steps": 0}, "num_steps must be a positive integer")])
def test_profile_rejects_bad_steps(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProfileSteps(tmp_path, **kwargs)
