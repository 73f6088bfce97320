"""``zoo bench cnn`` in-process on a tiny config: structure and the same-maths check, no timing thresholds."""

import dataclasses
import math

import jax
import keras
import pytest

from zoo.bench import cnn_fit
from zoo.bench.cnn_fit import SameMathsError, run_benchmark
from zoo.config.bench_settings import CNNBenchSettings
from zoo.data import load_shapes
from zoo.training.cnn import build_cnn, compile_cnn

TINY = {"image_size": 16, "batch_size": 16, "steps": 2, "repeats": 1}


def test_config_fields_match_the_cli_flags():
    assert [f.name for f in dataclasses.fields(CNNBenchSettings)] == [
        "image_size",
        "batch_size",
        "steps",
        "repeats",
        "output",
    ]


def test_tiny_benchmark_reports_every_layout(tmp_path):
    output = tmp_path / "bench.md"
    lines = []
    rows = run_benchmark(CNNBenchSettings(**TINY, output=str(output)), report=lines.append)

    assert [(r["layout"], r["mesh"]) for r in rows] == [
        ("single device", "-"),
        ("DataParallel", "data=8"),
        ("ModelParallel", "data=2,model=4"),
    ]
    for row in rows:
        for key in ("fit_images_per_s", "jit_images_per_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["layout"], key, row[key])
        assert row["ratio"] == pytest.approx(row["fit_images_per_s"] / row["jit_images_per_s"], rel=1e-12)
        assert len(row["fit_runs"]) == len(row["jit_runs"]) == TINY["repeats"]
        # The same-maths check ran and passed on this layout.
        assert 0.0 <= row["loss_gap"] <= cnn_fit.LOSS_ATOL + cnn_fit.LOSS_RTOL * 10
    table = output.read_text()
    assert "| layout | mesh | fit images/s | jax.jit images/s | ratio fit/jit |" in table
    assert "| DataParallel | data=8 |" in table and "image size 16, batch size 16" in table
    assert table.strip() == lines[-1].strip()
    assert keras.distribution.distribution() is None


def test_batch_that_does_not_split_over_the_data_axis_is_rejected_before_any_work():
    with pytest.raises(ValueError, match="batch size 12 is not divisible by the data axis of size 8"):
        run_benchmark(CNNBenchSettings(image_size=16, batch_size=12, steps=1, repeats=1))


def test_non_positive_settings_are_rejected():
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        run_benchmark(CNNBenchSettings(**{**TINY, "steps": 0}))


def test_compare_losses_accepts_rounding_and_rejects_real_gaps():
    assert cnn_fit.compare_losses(2.0794415, 2.0794415) == 0.0
    assert cnn_fit.compare_losses(2.0, 2.0 + 1e-6) == pytest.approx(1e-6)
    with pytest.raises(SameMathsError, match="different maths"):
        cnn_fit.compare_losses(2.0, 2.001)
    with pytest.raises(SameMathsError):
        cnn_fit.compare_losses(float("nan"), 2.0)


def _inference_mode_step(model):
    """A plausible mistake: the hand-written step runs batch norm in inference mode."""

    def step(state, x, y):
        trainable, non_trainable, optimizer = state

        def loss_fn(trainable):
            logits, _ = model.stateless_call(trainable, non_trainable, x, training=False)
            return model.compute_loss(x=x, y=y, y_pred=logits, training=True)

        loss, grads = jax.value_and_grad(loss_fn)(trainable)
        trainable, optimizer = model.optimizer.stateless_apply(optimizer, grads, trainable)
        return loss, (trainable, non_trainable, optimizer)

    return jax.jit(step)


def test_same_maths_check_passes_the_real_step_and_catches_a_different_one():
    x, y = load_shapes("train", image_size=16, num_examples=32, seed=0)
    model = build_cnn(16, seed=0)
    compile_cnn(model)
    cnn_fit.fit_rate(model, x[:16], y[:16], 16)  # builds the optimizer
    shardings = cnn_fit.data_shardings(None, x, y)

    gap, _ = cnn_fit.check_same_maths(model, cnn_fit.make_jit_step(model, None), x[:16], y[:16], shardings)
    assert gap <= cnn_fit.LOSS_ATOL + cnn_fit.LOSS_RTOL * 10

    with pytest.raises(SameMathsError, match="different maths"):
        cnn_fit.check_same_maths(model, _inference_mode_step(model), x[16:], y[16:], shardings)
