"""``zoo bench context`` in-process on tiny sizes: memory ordering, goal logic, flags.

Compile only (the benchmark never runs a step), so the numbers are deterministic.
"""

import dataclasses

import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import context_parallel_memory as bench
from zoo.bench.context_parallel_memory import Run, run_benchmark
from zoo.cli import bench as bench_cli
from zoo.config.bench_settings import ContextBenchSettings

TINY = {"sequence_length": 128, "layers": 1, "width": 16, "heads": 2, "head_dim": 8, "hidden_dim": 32, "vocab": 16}


def test_context_parallel_step_needs_less_than_1_over_n_of_data_parallel_memory(tmp_path):
    output = tmp_path / "context.md"
    settings = ContextBenchSettings(**TINY, runs=("data=8:8", "data=1,seq=8:1"), output=str(output))
    lines = []
    result = run_benchmark(settings, report=lines.append)
    data, context = result["runs"]
    assert (data.kind, data.tokens_per_device, context.kind, context.tokens_per_device) == (
        "data-parallel",
        128,
        "context-parallel",
        16,
    )
    assert 0 < context.temp <= data.temp / 8, (context.temp, data.temp)
    # Ring over N = 8, counted through its loops: K and V make N-1 hops forward and N-1
    # backward, dK and dV N hops: 6N - 4 permutes. Data parallelism only all-reduces gradients.
    assert context.collectives["collective-permute"] == 6 * 8 - 4 and context.exact
    assert "collective-permute" not in data.collectives and data.collectives["all-reduce"] >= 1
    shard = 1 * (128 // 8) * 2 * 8 * 4  # f32 K (or V) shard [B, T/N, K, D] in bytes
    gradients = data.sent  # data parallelism sends only the gradient all-reduce
    # ContextParallel splits the weights over seq (FSDP): each is all-gathered where it is
    # used (forward, again in the backward) and its gradient reduce-scattered, between
    # once and twice the bytes of the gradient all-reduce, on top of the ring's hops
    ring = (6 * 8 - 4) * shard
    assert ring + gradients <= context.sent <= ring + 2 * gradients, (context.sent, ring, gradients)
    assert result["goal"][0] == "PASS"
    text = output.read_text()
    assert "| data-parallel | data=8 | 8 | 128 |" in text and "| context-parallel | data=1,seq=8 | 1 | 16 |" in text
    assert text.strip() == lines[-1].strip()


def test_goal_logic_on_given_numbers():
    settings = ContextBenchSettings(sequence_length=100)
    base = Run("data=8", 8, "data-parallel", tokens_per_device=100, temp=800)
    runs = [base, Run("data=1,seq=8", 1, "context-parallel", tokens_per_device=25, temp=150)]
    assert bench.evaluate_goal(runs, settings)[0] == "PASS"  # 150/800 <= 1/4
    runs[1].temp = 250
    status, detail = bench.evaluate_goal(runs, settings)
    assert status == "MISS" and "0.3125 x (1/4 = 0.2500)" in detail
    assert bench.evaluate_goal(runs[1:], settings)[0] == "NOT MEASURED"


@pytest.mark.parametrize(
    "run, message",
    [
        ("data=8", "must be '<mesh>:<global batch>'"),
        ("data=2,model=4:2", r"needs a 'data' axis and may have 'seq', got axes \['data', 'model'\]"),
        ("data=2,seq=4:3", "batch 3 is not divisible by the 'data' axis of size 2"),
        ("data=1,seq=16:1", "needs 16 devices but JAX has 8"),
        ("data=1,seq=3:1", "sequence length 128 is not divisible by 6"),
    ],
)
def test_bad_runs_are_rejected_before_any_work(run, message):
    with pytest.raises(ValueError, match=message):
        run_benchmark(ContextBenchSettings(**TINY, runs=(run,)), report=lambda line: None)


def _parse(argv):
    return parse_bench_args("context", argv)


def test_cli_flags_cover_the_config_and_keep_its_defaults():
    assert bench_cli.settings_from_args("context", _parse([])) == ContextBenchSettings()
    args = _parse(
        [
            "--sequence-length",
            "64",
            "--runs",
            "data=8:8; data=2,seq=4:2",
            "--balance",
            "none",
            "--context-attention",
            "gather",
        ]
    )
    settings = bench_cli.settings_from_args("context", args)
    assert (settings.sequence_length, settings.runs, settings.balance, settings.context_attention) == (
        64,
        ("data=8:8", "data=2,seq=4:2"),
        None,
        "gather",
    )
    assert set(vars(args)) - {"bench", "func", "simulate_devices"} == {
        f.name for f in dataclasses.fields(ContextBenchSettings)
    }
    with pytest.raises(SystemExit):
        _parse(["--runs", "data=8"])
