"""Step reports (time, throughput, MFU; process 0 only; into the Keras logs), the run's
metrics.csv / steps.csv, config and mesh printouts, profiler traces."""

import csv
import dataclasses
import os
import types

import keras
import numpy as np
import pytest

from zoo.distribution import make_mesh
from zoo.training.callbacks import Throughput
from zoo.training.logs import report as report_module
from zoo.training.logs import run_logs
from zoo.training.logs.profile import ProfileSteps
from zoo.training.logs.report import (
    StepReport,
    StepStats,
    format_config,
    format_mesh,
    format_stats,
    print_mesh,
)

BATCH, STEPS, FEATURES = 8, 5, 4


def _fit(callbacks, steps=STEPS, epochs=1, initial_epoch=0, validation=False):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1, name="out")]
    )
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(steps * BATCH, FEATURES)).astype("float32")
    validation_data = (x[:BATCH], x[:BATCH, :1]) if validation else None
    return model.fit(
        x,
        x[:, :1],
        batch_size=BATCH,
        epochs=epochs,
        initial_epoch=initial_epoch,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
        validation_data=validation_data,
    )


class _Logs(keras.callbacks.Callback):
    """What a logger placed after the reporting callbacks (CSVLogger, TensorBoard) is handed."""

    def __init__(self):
        super().__init__()
        self.steps, self.epochs = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(dict(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def test_step_report_numbers_follow_the_formulas():
    lines = []
    flops = 6 * (FEATURES * 8 + 8 * 1) * BATCH  # 6 * matmul weights * examples per step
    callback = StepReport(
        BATCH,
        unit="examples",
        flops_per_step=flops,
        peak_flops_per_device=1e9,
        num_devices=2,
        every=2,
        report=lines.append,
    )
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


def test_step_report_writes_its_figures_into_the_logs_of_later_callbacks():
    flops = 6 * (FEATURES * 8 + 8 * 1) * BATCH
    callback, seen = (
        StepReport(
            BATCH,
            unit="tokens",
            flops_per_step=flops,
            peak_flops_per_device=1e9,
            num_devices=2,
            every=2,
            report=lambda line: None,
        ),
        _Logs(),
    )
    history = _fit([callback, seen])
    reported = [index + 1 for index, logs in enumerate(seen.steps) if "tokens_per_second" in logs]
    assert reported == [s.step for s in callback.stats] == [3, 5]
    for stats in callback.stats:
        logs = seen.steps[stats.step - 1]
        assert (logs["tokens_per_second"], logs["step_time_s"], logs["mfu"]) == (
            stats.items_per_s,
            stats.step_time_s,
            stats.mfu,
        )
    (epoch,) = seen.epochs  # the epoch's mean over its steps after the first (steps 2-5)
    assert epoch["step_time_s"] == pytest.approx(sum(s.step_time_s * s.steps for s in callback.stats) / 4)
    assert epoch["tokens_per_second"] == pytest.approx(BATCH / epoch["step_time_s"])
    assert epoch["mfu"] == pytest.approx(flops / epoch["step_time_s"] / 2e9)
    assert history.history["tokens_per_second"] == [epoch["tokens_per_second"]]  # History sees them too


def test_step_report_starts_its_line_after_a_progress_bar():
    callback = StepReport(BATCH, every=1)
    callback.set_params({"verbose": 1})
    assert report_module.own_line(callback, "step 3") == "\nstep 3"
    callback.set_params({"verbose": 2})
    assert report_module.own_line(callback, "step 3") == "step 3"


def test_throughput_logs_each_epoch_and_prints_after_kerass_line():
    lines, seen = [], _Logs()
    throughput = Throughput(BATCH, lines.append)

    class Marker(keras.callbacks.Callback):  # stands in for Keras' own epoch line, printed after every callback
        def on_epoch_end(self, epoch, logs=None):
            lines.append(f"keras epoch {epoch + 1}")

    _fit([throughput, seen, Marker()], epochs=2)
    assert [e["images_per_second"] for e in seen.epochs] == throughput.per_epoch and all(
        r > 0 for r in throughput.per_epoch
    )
    assert (
        lines[0] == "keras epoch 1" and lines[1].startswith("epoch 1: ") and lines[1].endswith("(includes compilation)")
    )
    assert lines[2] == "keras epoch 2" and lines[3].startswith("epoch 2: ") and len(lines) == 4


def test_throughput_with_log_steps_gives_steps_csv_a_row_per_step(tmp_path):
    """The jobs without a StepReport (zoo train cnn, encoder, vit): every step's own time and rate."""
    seen = _Logs()
    throughput = Throughput(BATCH, lambda line: None, log_steps=True)
    _fit([throughput, seen, *run_logs.run_log_callbacks(tmp_path)], epochs=2)
    steps = _csv(tmp_path / "steps.csv")
    assert [(r["epoch"], r["step"]) for r in steps] == [("1", str(n)) for n in range(1, 6)] + [
        ("2", str(n)) for n in range(6, 11)
    ]
    assert [float(r["step_time_s"]) for r in steps] == [logs["step_time_s"] for logs in seen.steps]
    assert all(
        float(r["images_per_second"]) == pytest.approx(BATCH / float(r["step_time_s"])) and r["loss"] for r in steps
    )
    assert (
        sum(logs["step_time_s"] for logs in seen.steps[5:]) <= 5 * BATCH / throughput.per_epoch[1] + 1e-9
    )  # within the epoch's clock
    assert "step_time_s" not in Throughput(BATCH, lambda line: None).__dict__ and not [  # without it: epochs only
        logs for logs in _fit_logs(Throughput(BATCH, lambda line: None)) if "step_time_s" in logs
    ]


def _fit_logs(callback):
    seen = _Logs()
    _fit([callback, seen])
    return seen.steps


def test_every_job_writes_its_run_files_to_its_own_folder_beside_its_output(tmp_path):
    """OUTPUT.run beside --output, a .keras file's name without .keras: two runs whose outputs
    share a folder never overwrite one another's metrics.csv (zoo train, zoo finetune)."""
    from zoo.training.job_setup import run_dir_of

    assert run_dir_of(str(tmp_path / "runs" / "cnn.keras")) == str(tmp_path / "runs" / "cnn.run")
    assert run_dir_of(str(tmp_path / "runs" / "x"), output_is_folder=True) == str(tmp_path / "runs" / "x.run")
    assert run_dir_of("a.keras") != run_dir_of("b.keras")
    assert run_dir_of(None, fallback="runs/finetune") == "runs/finetune"


def test_a_run_without_an_output_gets_a_folder_no_run_has_used(tmp_path):
    """zoo finetune with no --output and no checkpoint folder: never another run's metrics.csv."""
    from zoo.training.job_setup import new_run_folder

    first = new_run_folder(str(tmp_path))
    os.makedirs(first)
    second = new_run_folder(str(tmp_path))
    assert os.path.dirname(first) == os.path.dirname(second) == str(tmp_path)
    assert second != first and not os.path.exists(second)  # first-2 within the same second


def _csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_run_logs_write_every_epoch_and_the_reported_steps_and_append_on_resume(tmp_path):
    report = StepReport(BATCH, unit="tokens", every=2, report=lambda line: None)
    _fit([report, *run_logs.run_log_callbacks(tmp_path)], epochs=2, validation=True)
    epochs, steps = _csv(tmp_path / "metrics.csv"), _csv(tmp_path / "steps.csv")
    assert [(r["epoch"], r["step"]) for r in epochs] == [("1", "5"), ("2", "10")]
    assert list(epochs[0]) == ["epoch", "step", "loss", "step_time_s", "tokens_per_second", "val_loss"]
    assert all(float(r["val_loss"]) > 0 and float(r["tokens_per_second"]) > 0 for r in epochs)
    # StepReport reports steps 3 and 5 of epoch 1 (step 1 is compilation), 8 and 10 of epoch 2 (the window restarts)
    assert [(r["epoch"], r["step"]) for r in steps] == [("1", "3"), ("1", "5"), ("2", "8"), ("2", "10")]
    assert [float(r["tokens_per_second"]) for r in steps] == [s.items_per_s for s in report.stats]

    # resumed from the checkpoint of step 5: epoch 2 again; its first run's rows go, the rest stay
    _fit(
        [
            StepReport(BATCH, every=2, report=lambda line: None),
            *run_logs.run_log_callbacks(tmp_path, resume=True, initial_step=5),
        ],
        epochs=2,
        initial_epoch=1,
    )
    resumed = _csv(tmp_path / "metrics.csv")
    assert [(r["epoch"], r["step"]) for r in resumed] == [("1", "5"), ("2", "10")]
    assert resumed[0] == epochs[0] and resumed[1]["val_loss"] == "" and float(resumed[1]["loss"]) > 0
    assert [(r["epoch"], r["step"]) for r in _csv(tmp_path / "steps.csv")] == [
        ("1", "3"),
        ("1", "5"),
        ("2", "8"),
        ("2", "10"),
    ]

    _fit(run_logs.run_log_callbacks(tmp_path))  # a fresh run starts the files afresh
    assert [(r["epoch"], r["step"]) for r in _csv(tmp_path / "metrics.csv")] == [("1", "5")]
    assert not (tmp_path / "steps.csv").exists()  # it reported no step: no header-only file, nor the last run's


def test_run_logs_write_tensorboard_scalars_when_a_writer_is_importable(tmp_path, monkeypatch):
    written = []

    class Writer:  # the part of tensorboardX.SummaryWriter the logger uses
        def __init__(self, logdir):
            written.append(("open", str(logdir)))

        def add_scalar(self, tag, value, step):
            written.append((tag, step))

        def flush(self):
            pass

        def close(self):
            written.append(("close",))

    monkeypatch.setattr(run_logs, "tensorboard_writer_class", lambda: Writer)
    _fit([StepReport(BATCH, every=4, report=lambda line: None), *run_logs.run_log_callbacks(tmp_path)])
    assert written[0] == ("open", str(tmp_path / "tensorboard")) and written[-1] == ("close",)
    assert set(written[1:-1]) == {
        ("step/loss", 5),
        ("step/tokens_per_second", 5),
        ("step/step_time_s", 5),
        ("epoch/loss", 5),
        ("epoch/tokens_per_second", 5),
        ("epoch/step_time_s", 5),
    }


def test_run_logs_only_on_process_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(run_logs, "is_primary", lambda: False)
    assert run_logs.run_log_callbacks(tmp_path) == []


def test_step_report_prints_only_on_process_zero(monkeypatch):
    monkeypatch.setattr(report_module, "is_primary", lambda: False)
    lines = []
    callback = StepReport(BATCH, every=1, report=lines.append)
    _fit([callback], steps=3)
    assert lines == []
    assert len(callback.stats) == 2 and all(s.mfu is None for s in callback.stats)  # measured all the same


def test_format_stats():
    stats = StepStats(
        step=20, steps=10, step_time_s=0.0123, items_per_s=1_234_567.4, items_per_s_per_device=154_320.9, mfu=0.4123
    )
    assert format_stats(stats) == "step 20: 12.3 ms/step, 1,234,567 tokens/s (154,321 tokens/s per device), MFU 41.2%"
    assert format_stats(dataclasses.replace(stats, mfu=None), "images").endswith("(154,321 images/s per device)")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"items_per_step": 0}, "items_per_step must be positive"),
        ({"items_per_step": 1, "every": 0}, "every must be a positive integer"),
    ],
)
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
    devices = np.array(
        [
            [types.SimpleNamespace(process_index=p, device_kind="NVIDIA H200", platform="gpu") for _ in range(4)]
            for p in range(2)
        ]
    )
    mesh = types.SimpleNamespace(
        backend_mesh=types.SimpleNamespace(devices=devices), axis_names=("data", "model"), shape=(2, 4)
    )
    assert format_mesh(mesh)[1:] == [
        "  axis 'data' of size 2: crosses processes",
        "  axis 'model' of size 4: within each process",
    ]


def test_print_mesh_of_a_distribution():
    lines = []
    print_mesh(keras.distribution.DataParallel(device_mesh=make_mesh("data=8")), report=lines.append)
    assert lines[0] == "distribution: DataParallel, batch split over 'data'"
    assert lines[1].startswith("mesh: data=8 over 8 x cpu")


def test_profile_writes_a_trace_of_the_chosen_steps(tmp_path):
    from zoo.training.logs.profile import trace_options

    assert trace_options().python_tracer_level == 0  # device and host ops; JAX's default also traces Python
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


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"start_step": -1}, "start_step must be a non-negative integer"),
        ({"num_steps": 0}, "num_steps must be a positive integer"),
    ],
)
def test_profile_rejects_bad_steps(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProfileSteps(tmp_path, **kwargs)
