"""``zoo bench lm-head`` on a tiny model (V=256, C=16, T=16) on the 8 simulated devices,
compile-only: at b=4 (B x T = 512 > V) the head gathers its table, a program that sends
no more than the cheaper forced one and equals the forced table's; the flags parse. The
other choice (activations, b=1) compile-only: tests/models/test_lm_head_gather.py."""

import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import lm_head as bench
from zoo.config.bench_settings import LMHeadBenchSettings

TINY = {
    "vocabulary_size": 256,
    "num_layers": 1,
    "hidden_dim": 16,
    "num_query_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_dim": 32,
    "sequence_length": 16,
    "devices": (8,),
    "per_device_batches": (4,),
    "heads": ("untied",),
    "precision": "float32",
}


def test_rows_choose_the_cheaper_gather_and_write_the_table(tmp_path):
    output = tmp_path / "lm_head.md"
    rows = bench.run_benchmark(LMHeadBenchSettings(**TINY, output=str(output)), report=lambda line: None)["rows"]
    (row,) = rows
    assert (row.per_device_batch, row.choice, row.cheapest) == (4, "table", "table")
    assert row.sent["chosen"] == row.sent["table"] < row.sent["activations"] and row.meets_goal, row
    assert output.read_text().splitlines()[-1] == bench.format_row(row)


def test_flags_parse_into_the_settings_and_too_many_devices_are_refused():
    args = parse_bench_args("lm-head", ["--devices", "8,64", "--per-device-batches", "2", "--heads", "tied"])
    settings = bench.LMHeadBenchSettings(
        **{name: getattr(args, name) for name in ("devices", "per_device_batches", "heads")}
    )
    assert (settings.devices, settings.per_device_batches, settings.heads) == ((8, 64), (2,), ("tied",))
    with pytest.raises(ValueError, match="64 devices asked for but JAX has 8"):
        bench.check_settings(settings)
