"""``zoo bench attention`` in-process on tiny sizes: structure, memory ordering, goal logic, flags.

No timing thresholds: times on a shared CPU are noise at these sizes.
"""

import dataclasses

import pytest

from tests.bench._cli import parse_bench_args
from tests.plotting._png import png_size
from zoo.bench import attention_memory as bench
from zoo.bench.attention_memory import run_benchmark
from zoo.cli import bench as bench_cli
from zoo.config.bench_settings import AttentionBenchSettings

# One T for the memory table, the timings and the goal: 8 compiled programs (4 kernels
# x N = 4, 8), all timed from the same dict. Ring tiles at T=128, block 16: the zig-zag
# halves of a shard are 16 rows at N=4 (tile = block) and 8 at N=8 (tile cut to 8).
TINY = {
    "lengths": (128,),
    "devices": (4, 8),
    "head_dim": 8,
    "block_size": 16,
    "time_lengths": (128,),
    "goal_length": 128,
    "goal_heads": 8,
    "repeats": 1,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    output, chart = folder / "attention.md", folder / "attention.png"
    lines = []
    result = run_benchmark(AttentionBenchSettings(**TINY, output=str(output), plot=str(chart)), report=lines.append)
    return result, lines, output.read_text(), chart


def test_memory_table_has_every_kernel_and_the_kernels_beat_the_reference(tiny):
    result, _, _, _ = tiny
    assert [(r["length"], r["devices"]) for r in result["memory"]] == [(128, 4), (128, 8)]
    for row in result["memory"]:
        temp = row["temp"]
        assert set(temp) == set(bench.KERNELS) and all(b > 0 for b in temp.values()), row
        # the reference materialises f32 scores; every kernel walks tiles (all-gather and
        # Ulysses with the blockwise kernel on their local step) and needs less
        assert max(temp["gather"], temp["ring"], temp["ulysses"]) < temp["reference"], row
        # the ring never holds more than a shard's K/V: less than all-gather's whole gathered K/V
        assert temp["ring"] < temp["gather"], row
    at_128 = {r["devices"]: r["temp"] for r in result["memory"] if r["length"] == 128}
    # the reference's scores are f32[B, H, T/N, T] per device: halving T/N roughly halves them
    assert at_128[8]["reference"] < 0.75 * at_128[4]["reference"]


def test_time_rows_and_goals(tiny):
    result, lines, text, _ = tiny
    timed = [(r["length"], r["heads"], r["devices"]) for r in result["time"]]
    assert timed == [(128, 8, 4), (128, 8, 8), (128, 8, 8)]
    for row in result["time"][:2]:
        assert set(row["wall"]) == set(bench.KERNELS) and all(t > 0 for t in row["wall"].values())
    assert set(result["time"][2]["wall"]) == {"gather", "ring"}
    assert [g.status in ("PASS", "MISS") for g in result["goals"]] == [True, True, True]
    assert "| T | N | GSPMD reference | all-gather | ring | Ulysses |" in text
    assert "Goals:" in text and text.strip() == lines[-1].strip()


def test_plot_draws_memory_against_sequence_length(tiny):
    assert png_size(tiny[3]) == (1100, 420)  # one 5.5 x 4.2 inch panel per N (4, 8) at 100 dpi


def test_timing_over_the_memory_limit_is_skipped_and_the_goal_says_so():
    # the fixture's T and N: the programs come from the compilation cache
    settings = AttentionBenchSettings(**{**TINY, "devices": (8,), "memory_limit_gib": 1e-9})
    result = run_benchmark(settings, report=lambda line: None)
    assert all(not row["wall"] for row in result["time"])
    assert "host memory" in result["time"][0]["skipped"]["ring"]
    assert result["goals"][-1].status == "NOT MEASURED"


def test_goal_logic_on_given_numbers():
    settings = AttentionBenchSettings(lengths=(100,), devices=(4, 8))
    memory = [
        {"length": 100, "devices": 4, "temp": {"reference": 1000, "ring": 100}},
        {"length": 100, "devices": 8, "temp": {"reference": 500, "ring": 70}},
    ]
    timing = {"length": 16, "heads": 1, "devices": 8, "wall": {"gather": 2.0, "ring": 1.0}, "cpu": {}, "skipped": {}}
    goals = bench.evaluate_goals(settings, memory, timing)
    # 70/500 = 0.14 > 1/8; 70/100 = 0.7 > 0.6; 1.0 s <= 2.0 s
    assert [g.status for g in goals] == ["MISS", "MISS", "PASS"]
    memory[1]["temp"]["ring"] = 50
    assert [g.status for g in bench.evaluate_goals(settings, memory, timing)][:2] == ["PASS", "PASS"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"devices": (16,)}, "needs 16 devices .* JAX has 8"),
        ({"lengths": (100,)}, "sequence length 100 is not divisible by 2 x N = 8"),
        ({"repeats": 0}, "repeats must be a positive integer, got 0"),
        ({"time_lengths": ()}, "time_lengths must be non-empty"),
    ],
)
def test_bad_settings_are_rejected_before_any_work(change, message):
    with pytest.raises(ValueError, match=message):
        run_benchmark(AttentionBenchSettings(**{**TINY, **change}), report=lambda line: None)


def _parse(argv):
    return parse_bench_args("attention", argv)


def test_cli_flags_cover_the_config_and_keep_its_defaults():
    assert bench_cli.settings_from_args("attention", _parse([])) == AttentionBenchSettings()
    args = _parse(
        [
            "--lengths",
            "64,128",
            "--devices",
            "8",
            "--balance",
            "none",
            "--no-causal",
            "--repeats",
            "1",
            "--plot",
            "m.png",
        ]
    )
    settings = bench_cli.settings_from_args("attention", args)
    assert (settings.lengths, settings.devices, settings.balance, settings.causal, settings.repeats, settings.plot) == (
        (64, 128),
        (8,),
        None,
        False,
        1,
        "m.png",
    )
    assert set(vars(args)) - {"bench", "func", "simulate_devices"} == {
        f.name for f in dataclasses.fields(AttentionBenchSettings)
    }
    with pytest.raises(SystemExit):
        _parse(["--lengths", "4k"])
