"""``zoo bench pipeline`` on tiny sizes: the bubble rows equal the formula through the
kernel, one pipelined GPT step compiled (never run) with the blocks' weights split by
stage, and the settings refusing a schedule that cannot run."""

import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import pipeline as bench
from zoo.cli import bench as bench_cli
from zoo.config.bench_settings import PipelineBenchSettings

TINY = {
    "vocabulary_size": 32,
    "num_layers": 2,
    "hidden_dim": 8,
    "num_query_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "intermediate_dim": 16,
    "sequence_length": 8,
    "batch_size": 2,
    "mesh": "data=1,stage=2",
    "reference_mesh": "data=1",
}


@pytest.mark.parametrize("stages, repeats, micro_batches", [(2, 1, 3), (4, 2, 4)])  # M not a multiple of S; circular
def test_bubble_rows_are_the_kernels_count_and_equal_the_formula(stages, repeats, micro_batches):
    row = bench.measure_bubble(stages, repeats, micro_batches)
    assert row.useful == (repeats * micro_batches,) * stages and row.ticks == repeats * micro_batches + stages - 1
    assert (
        row.measured == pytest.approx(repeats * micro_batches / (repeats * micro_batches + stages - 1)) == row.formula
    )
    assert row.bubble_steps == (stages - 1) / repeats


def test_pipelined_row_splits_the_blocks_by_stage_and_counts_its_permutes():
    settings = PipelineBenchSettings(**TINY, sections=("memory",))
    row = bench.measure_memory(settings, "none", repeats=1, micro_batches=2)
    analysis = row.compiled.memory_analysis()
    assert (row.memory.temp, row.memory.argument) == (analysis.temp_size_in_bytes, analysis.argument_size_in_bytes)
    # 2 blocks stacked (1, 2, ...) split over stage=2: each device holds one; the embedding
    # (32 x 8, tied), the final norm (8) and the dropout seed (u32[2]) are on every device.
    assert row.block_weights * 2 == row.model_block_weights and row.other_weights == (32 * 8 + 8) * 4 + 8
    assert row.memory.weights == row.block_weights + row.other_weights
    assert row.permutes == 2 * (2 + 2 - 1)  # one per tick forward, one per tick backward
    line = bench.format_memory(settings, [row])[-1]
    assert line.startswith("| gpipe | pipeline | data=1,stage=2 | none | 1 | 2 | ") and "| 1.000 |" in line


def _parse(argv):
    return parse_bench_args("pipeline", argv)


def test_settings_parse_and_refuse_bad_numbers(capsys):
    assert bench_cli.settings_from_args("pipeline", _parse([])) == PipelineBenchSettings()
    settings = bench_cli.settings_from_args(
        "pipeline", _parse(["--micro-batches", "2", "--repeats", "2", "--sections", "bubble"])
    )
    with pytest.raises(ValueError, match=r"micro_batches=2 < 4 stages"):
        bench.run_benchmark(settings, report=lambda line: None)
    with pytest.raises(SystemExit):
        _parse(["--micro-batches", "4,0"])
    assert "expected comma-separated integers >= 1" in capsys.readouterr().err
