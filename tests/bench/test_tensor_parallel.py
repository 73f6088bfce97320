"""``zoo bench tp`` in-process on tiny shapes: the table's structure and its communication numbers.

No timing thresholds: times are ratios measured on a shared machine. The bytes are
exact (read from the compiled programs), so they are asserted.
"""

import dataclasses
import math

import keras
import pytest

from tests.bench._cli import parse_bench_args
from tests.plotting._png import png_size
from zoo.bench.tensor_parallel import run_benchmark
from zoo.config.bench_settings import TPBenchSettings
from zoo.measure.tensor_parallel_mlp import minimum_sent_bytes

TINY = [
    "--batch-size",
    "4",
    "--sequence-length",
    "16",
    "--dim",
    "8",
    "--hidden",
    "32",
    "--steps",
    "1",
    "--repeats",
    "1",
    "--fast-compile",
]


def _parse(argv):
    return parse_bench_args("tp", argv)


def test_every_config_field_is_a_flag_with_the_same_default():
    args = vars(_parse([]))
    defaults = dataclasses.asdict(TPBenchSettings())
    assert {k: args[k] for k in defaults} == defaults


def test_tiny_benchmark_table(tmp_path, capsys):
    output, chart = tmp_path / "tp.md", tmp_path / "tp.png"
    args = _parse([*TINY, "--variants", "gated,sp", "--output", str(output), "--plot", str(chart)])
    assert args.func(args) == 0
    assert png_size(chart) == (700, 420)  # bytes per implementation, one group per variant
    table = output.read_text()
    rows = [
        line.split(" | ")
        for line in table.splitlines()
        if line.startswith(("| gated MLP |", "| MLP, sequence-parallel |"))
    ]
    got = {(r[0].strip("| "), r[1]): r for r in rows}
    assert list(got) == [
        ("gated MLP", "explicit"),
        ("gated MLP", "GSPMD"),
        ("gated MLP", "minimum (Megatron)"),
        ("MLP, sequence-parallel", "explicit"),
        ("MLP, sequence-parallel", "explicit, collective matmul"),
        ("MLP, sequence-parallel", "GSPMD"),
        ("MLP, sequence-parallel", "minimum (Megatron)"),
    ]
    # B/dp T D x 4 bytes = 2 x 16 x 8 x 4 = 1 KiB; two all-reduces over 4 devices: 2 x 2 x 3/4 KiB
    assert minimum_sent_bytes(TPBenchSettings(batch_size=4, sequence_length=16, dim=8, hidden=32)) == 3072
    for key in [
        ("gated MLP", "explicit"),
        ("MLP, sequence-parallel", "explicit"),
        ("MLP, sequence-parallel", "explicit, collective matmul"),
    ]:
        assert got[key][3] == "3.0" and got[key][4] == "1.00", got[key]  # explicit TP equals the minimum
    assert got[("gated MLP", "explicit")][2] == "2 all-reduce"
    assert got[("MLP, sequence-parallel", "explicit")][2] == "2 all-gather + 2 reduce-scatter"
    assert got[("MLP, sequence-parallel", "explicit, collective matmul")][2] == "12 collective-permute"
    # GSPMD reduces d(input) once per projection (gated: 3 all-reduces), and in sequence-parallel
    # mode all-reduces and slices instead of reduce-scattering: more than the minimum.
    assert float(got[("gated MLP", "GSPMD")][4]) > 1 and float(got[("MLP, sequence-parallel", "GSPMD")][4]) > 1
    for row in rows:
        if row[1] != "minimum (Megatron)":
            ratio = float(row[7].strip(" |"))
            assert math.isfinite(ratio) and ratio > 0
    assert table.strip() in capsys.readouterr().out
    assert keras.distribution.distribution() is None


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_size": 3}, "batch size 3 is not divisible by the 'data' mesh axis of size 2"),
        ({"sequence_length": 10}, "sequence length 10 is not divisible by the 'model' mesh axis of size 4"),
        ({"variants": ("moe",)}, "variants must be some of"),
        ({"mesh": "data=8"}, "needs mesh axes"),
        ({"steps": 0}, "steps must be a positive integer, got 0"),
    ],
)
def test_bad_settings_are_rejected_before_any_work(changes, message):
    with pytest.raises(ValueError, match=message):
        run_benchmark(dataclasses.replace(TPBenchSettings(), **changes))
