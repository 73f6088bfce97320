"""``zoo bench moe``'s cheapest row: one tiny MoE GPT fit step compiled under layout
expert on data=2,expert=4 (8 simulated devices) and run once; its all-to-all bytes at
capacity factor 1.0 are the analytic minimum (within the [N_e, E_l] counts), each
device holds 1/E_p of every expert weight, nothing gathers an expert weight; and the
settings refuse what cannot run."""

import jax
import numpy as np
import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import moe as bench
from zoo.cli import bench as bench_cli
from zoo.config.bench_moe_settings import MoEBenchSettings
from zoo.kernels import moe
from zoo.measure.comms_report import FAST_COMPILE

TINY = {
    "num_layers": 1,
    "hidden_dim": 32,
    "num_query_heads": 2,
    "num_key_value_heads": 1,
    "num_experts": 8,
    "moe_intermediate_dim": 32,
    "vocabulary_size": 32,
    "sequence_length": 16,
    "batch_size": 8,
    "sections": ("exchange",),
}


def test_capacity_one_exchange_is_the_minimum_and_experts_are_split_one_per_device_share():
    settings = MoEBenchSettings(**TINY, meshes=("data=2,expert=4",), capacity_factors=(1.0,))
    row = bench.measure_exchange(settings, "data=2,expert=4", 1.0)
    # N = 8 x 16 / (2 x 4) = 16 tokens per device, A = 32 assignments, Q = ceil(32 / 4) = 8 rows to each device
    assert (row.expert_size, row.tokens, row.capacity, row.sparse_blocks) == (4, 16, 8, 1)
    assert (row.token_exchanges, row.count_exchanges, row.moved) == (
        4,
        1,
        "f32",
    )  # dispatch + combine, forward + backward; the counts once
    minimum = 4 * moe.minimum_exchange_bytes(16, num_experts_per_token=2, width=32, itemsize=4, axis_size=4)
    assert row.minimum == minimum == 4 * 16 * 2 * 32 * 4 * 3 / 4
    assert minimum <= row.sent <= 1.05 * minimum and row.ratio <= 1.05
    assert row.expert_parts == 4 and row.expert_bytes * 4 == row.model_expert_bytes == 3 * 8 * 32 * 32 * 4
    assert row.weight_gathers == 0  # no all-gather of an expert-weight-shaped buffer, none over 'expert'
    assert 0.0 < row.dropped_fraction < 1.0 and row.max_load >= 1.0  # one run: a random router overflows capacity 1.0
    line = bench.format_exchange(settings, [row])[-1]
    assert line.startswith("| data=2,expert=4 | 4 | 1 | 16 | 8 | 4 (+1) |") and "| 1/4 | 0 |" in line


def _parse(argv):
    return parse_bench_args("moe", argv)


def test_settings_parse_and_refuse_bad_numbers(capsys):
    assert bench_cli.settings_from_args("moe", _parse([])) == MoEBenchSettings()
    settings = bench_cli.settings_from_args(
        "moe", _parse(["--capacity-factors", "1,dropless", "--memory-partial-layers", "none"])
    )
    assert settings.capacity_factors == (1.0, None) and settings.memory_partial_layers == ()
    settings = bench_cli.settings_from_args("moe", _parse(["--time-grouped-matmuls", "ragged_dot,megablox"]))
    assert settings.time_grouped_matmuls == ("ragged_dot", "megablox")
    with pytest.raises(ValueError, match="num_experts 6 is not divisible by the 'expert' axis of size 4"):
        bench.run_benchmark(MoEBenchSettings(**(TINY | {"num_experts": 6})), report=lambda line: None)
    with pytest.raises(ValueError, match="batch_size 4 is not divisible by data x expert = 8"):
        bench.run_benchmark(MoEBenchSettings(**(TINY | {"batch_size": 4})), report=lambda line: None)
    with pytest.raises(ValueError, match="the meshes need 64 devices but JAX has 8; run with --simulate-devices 64"):
        bench.run_benchmark(MoEBenchSettings(sections=("memory",)), report=lambda line: None)
    with pytest.raises(SystemExit):
        _parse(["--memory-runs", "frozen:expert:data=1,expert=8"])
    assert "expected ';'-separated '<method>:<layout>:<mesh>' runs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["--time-grouped-matmuls", "dense"])
    assert "unknown grouped matmul(s) ['dense']; choose from ragged_dot,megablox,blocks" in capsys.readouterr().err


def test_the_time_rows_refuse_a_sparse_result_the_dense_one_does_not_give():
    """The timing compares like with like: a gradient off by more than bf16's rounding, of
    the largest value, stops the benchmark before anything is timed."""
    dense = [np.ones((4, 8)), np.linspace(-2.0, 2.0, 32).reshape(4, 8)]
    rounded = [dense[0] + 0.02, dense[1] * (1 + 2e-3)]  # bf16-sized differences pass
    bench.check_agreement(rounded, dense, "mixed_bfloat16")
    with pytest.raises(bench.TimingMismatch, match=r"differ by up to 0.02 .*float32"):
        bench.check_agreement(rounded, dense, "float32")
    wrong = [dense[0], np.where(dense[1] == -2.0, 0.0, dense[1])]  # one entry off by its whole value
    with pytest.raises(bench.TimingMismatch, match=r"differ by up to 2 \(largest 2"):
        bench.check_agreement(wrong, dense, "mixed_bfloat16")


def test_ragged_rows_are_each_routed_row_once_per_exchange():
    """data=2, E_p=2, E=4 (E_l=2), k=1, 2 tokens per shard; shards (0,0), (0,1), (1,0), (1,1).
    Device (0,0) sends both its rows to device 1 and receives both of (0,1)'s: 2 x (2 + 2)
    per block; device (1,0) keeps its rows and receives one: 2 x (0 + 1)."""
    ids = np.array([[2], [3], [0], [1], [0], [1], [0], [3]])
    rows = bench.ragged_rows_sent([ids, ids], mesh_spec="data=2,expert=2", num_experts=4)
    assert rows.tolist() == [16, 16, 4, 4]
    # a balanced routing sends the analytic minimum: each shard 1/E_p of its A = N k rows to each device
    n, k, experts = 8, 2, 4
    balanced = np.tile(np.arange(2 * experts).reshape(-1, k), (2 * experts * n * k // (2 * experts), 1))
    rows = bench.ragged_rows_sent([balanced], mesh_spec="data=2,expert=4", num_experts=2 * experts)
    minimum = 4 * moe.minimum_exchange_bytes(n, num_experts_per_token=k, width=1, itemsize=1, axis_size=experts)
    assert rows.tolist() == [minimum] * 8


def test_compiled_for_given_devices_without_running():
    """compile_exchange on this process's CPU devices (a TPU topology's in the recipe):
    the fixed exchange's buffers and bytes, memory per device, no routing needed; and the
    routing the ragged rows are counted from, one per block."""
    settings = MoEBenchSettings(**TINY, meshes=("data=2,expert=4",), capacity_factors=(1.0,))
    row = bench.compile_exchange(
        settings, "data=2,expert=4", 1.0, devices=jax.devices(), platform="cpu", compiler_options=FAST_COMPILE
    )
    assert (row.token_exchanges, row.count_exchanges, row.capacity) == (4, 1, 8)
    assert row.buffers == 4 * (4 * 8 * 32 * 4)  # 4 exchanges of [E_p, Q, C] f32
    assert row.minimum <= row.sent <= 1.05 * row.minimum and row.routed_ratios == (row.ratio, row.ratio)
    assert row.memory.peak > row.memory.argument > 0 and row.all_reduces >= 1
    line = bench.format_topology_exchange(settings, [row], ("cpu", jax.devices()))[-1]
    assert line.startswith(
        "| data=2,expert=4 | 4 | all_to_all, capacity 1 | 4 (+1) | f32 | 16.0 KiB | 12.0 KiB | = sent |"
    )
    routings = bench.recorded_routing(settings)
    assert [r.shape for r in routings] == [(8 * 16, 2)] and 0 <= routings[0].min() and routings[0].max() < 8
    row.routed = bench.routed_exchange_bytes(settings, row, routings)
    assert len(row.routed) == 8 and np.mean(row.routed) == pytest.approx(
        np.mean(bench.ragged_rows_sent(routings, mesh_spec=row.mesh, num_experts=8)) * 32 * 4
    )
