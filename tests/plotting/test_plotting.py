"""``zoo plot`` on a finished run and the benchmark charts: PNG files of the expected size."""

import argparse
import sys

import keras
import numpy as np
import pytest

from tests.plotting._png import png_size
from zoo.cli import plot as plot_cli
from zoo.plotting import PLOT_INSTALL, plot_context_memory, plot_run
from zoo.training.logs.report import StepReport
from zoo.training.logs.run_logs import run_log_callbacks

BATCH, STEPS = 8, 4


def _finished_run(run_dir):
    """Two epochs of a tiny classifier with validation, logged as zoo train logs a run."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="logits")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(STEPS * BATCH, 4)).astype("float32"), rng.integers(0, 3, STEPS * BATCH)
    report = StepReport(BATCH, unit="examples", every=1, report=lambda line: None)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        validation_data=(x[:BATCH], y[:BATCH]),
        verbose=0,
        callbacks=[report, *run_log_callbacks(run_dir)],
    )


def test_zoo_plot_draws_a_finished_runs_metrics(tmp_path):
    _finished_run(tmp_path)
    parser = argparse.ArgumentParser()
    plot_cli.add_arguments(parser)
    assert plot_cli.run(parser.parse_args([str(tmp_path)])) == 0
    # three panels (loss, accuracy, examples/s), 8 x 2.6 inches each at 100 dpi
    assert png_size(tmp_path / "metrics.png") == (800, 780)
    import matplotlib.image

    pixels = matplotlib.image.imread(tmp_path / "metrics.png")
    assert pixels.shape[:2] == (780, 800) and pixels.std() > 0.05  # curves, not a blank canvas
    assert plot_run(tmp_path / "metrics.csv", tmp_path / "again.png") == tmp_path / "again.png"
    assert png_size(tmp_path / "again.png") == (800, 780)


def test_zoo_plot_names_a_folder_without_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.csv in"):
        plot_run(tmp_path)


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    rows = [{"kind": "data-parallel", "mesh": "data=8", "batch": 8, "temp": 2**30, "sent": 2**20}]
    with pytest.raises(ImportError, match=PLOT_INSTALL.replace("[", r"\[").replace("]", r"\]")):
        plot_context_memory(rows, tmp_path / "context.png")


def test_context_chart_from_a_tiny_table(tmp_path):
    runs = [
        {"kind": "data-parallel", "mesh": "data=8", "batch": 8, "temp": 48 * 2**30, "sent": 11 * 2**20},
        {"kind": "context-parallel", "mesh": "data=1,seq=8", "batch": 1, "temp": 149 * 2**20, "sent": 187 * 2**20},
    ]
    output = plot_context_memory(runs, tmp_path / "charts" / "context.png", title="tiny")
    assert png_size(output) == (1100, 360)  # 11 x (0.9 x 2 runs + 1.8) inches at 100 dpi
