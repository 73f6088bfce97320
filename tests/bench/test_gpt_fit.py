"""``zoo bench gpt`` in-process on a tiny config: the table and the same-maths check, no timing thresholds."""

import math

import keras
import pytest

from zoo.bench._fit_vs_jit import LOSS_ATOL, LOSS_RTOL
from zoo.bench.gpt_fit import run_benchmark
from zoo.config.bench_settings import GPTBenchSettings


def test_context_parallel_fit_and_jit_step_do_the_same_maths_and_are_tabled(tmp_path):
    output = tmp_path / "gpt.md"
    settings = GPTBenchSettings(
        config_name="gpt_tiny",
        sequence_length=16,
        batch_size=8,
        steps=2,
        repeats=1,
        output=str(output),
        layouts=("context",),
    )
    rows = run_benchmark(settings, report=lambda line: None)

    (row,) = rows
    assert (row["layout"], row["mesh"]) == ("context parallel (ring)", "data=2,seq=4")
    assert math.isfinite(row["ratio"]) and row["fit_per_s"] > 0 and row["jit_per_s"] > 0
    # the hand-written step and fit's step, from the same weights, gave the same loss
    assert 0.0 <= row["loss_gap"] <= LOSS_ATOL + LOSS_RTOL * 10
    table = output.read_text()
    assert "| context parallel (ring) | data=2,seq=4 |" in table and "gpt_tiny, T=16" in table
    assert keras.distribution.distribution() is None


def test_unknown_layout_is_named():
    with pytest.raises(ValueError, match=r"unknown layout\(s\) \['pipeline'\]"):
        run_benchmark(
            GPTBenchSettings(
                config_name="gpt_tiny", sequence_length=16, batch_size=8, steps=1, repeats=1, layouts=("pipeline",)
            )
        )
