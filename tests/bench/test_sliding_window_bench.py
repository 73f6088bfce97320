"""``zoo bench window`` on tiny sizes: the counted figures against closed forms, nothing timed.

Blockwise: T = 256 in tiles of 16 (R = 16 rows), W = 40: a query tile reaches back
d <= floor((W - 2) / 16) + 1 = 3 key tiles, so sum_i min(i, 3) + 1 = 58 tiles, against
R (R + 1) / 2 = 136 at full causal. Context: T = 512 over the 8 simulated devices (64
tokens each, zig-zag chunks of 32), float32 so every buffer is sent at its own size.
"""

import dataclasses

import pytest

from tests.bench._cli import parse_bench_args
from zoo import kernels
from zoo.bench import sliding_window as bench
from zoo.cli import bench as bench_cli
from zoo.config.bench_settings import WindowBenchSettings

N, T, W, BLOCK, HEADS, KV_HEADS, HEAD_DIM = 8, 512, 40, 16, 8, 2, 8
TINY = {
    "sliding_window": W,
    "heads": HEADS,
    "kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "dtype": "float32",
    "block_size": BLOCK,
    "blockwise_length": 256,
    "context_length": T,
    "devices": N,
}
KV_BYTES = (T // N) * KV_HEADS * HEAD_DIM * 4  # one shard's K (or V, or dK, or dV) in float32


@pytest.fixture(scope="module")
def tiny():
    lines = []
    settings = WindowBenchSettings(**TINY, context_attentions=("ring",))
    return run(settings, lines), lines


def run(settings, lines):
    return bench.run_benchmark(settings, report=lines.append)


def _closed_form_tiles(rows, reach):
    return sum(min(i, reach) + 1 for i in range(rows))


def test_blockwise_tiles_are_the_closed_form_counted_through_the_kernel(tiny):
    result, _ = tiny
    full, windowed = result["blockwise"]
    assert (full.window, windowed.window, full.tile) == (None, W, BLOCK)
    assert full.planned == full.counted == full.touched == 16 * 17 // 2 == 136
    assert (
        windowed.planned == windowed.counted == windowed.touched == _closed_form_tiles(16, (W - 2) // BLOCK + 1) == 58
    )
    assert windowed.pairs == W * 256 - W * (W - 1) // 2 and full.pairs == 256 * 257 // 2
    assert (
        windowed.temp > 0 and full.argument == windowed.argument == 4 * 256 * (2 * HEADS + 2 * KV_HEADS) * HEAD_DIM
    )  # q, k, v, d_out
    assert result["goals"][0].status == "PASS" and "58 vs 58: 1.000 x" in result["goals"][0].detail


def test_ring_sends_hops_times_one_hop_and_less_with_the_window(tiny):
    result, _ = tiny
    rows = {(r.balance, r.window): r for r in result["context"]}
    assert set(rows) == {(None, None), (None, W), ("zigzag", None), ("zigzag", W)}
    for balance in (None, "zigzag"):
        full, windowed = rows[(balance, None)], rows[(balance, W)]
        assert full.hops == N - 1
        assert windowed.steps == kernels.ring_steps(
            T, num_shards=N, block_size=BLOCK, balance=balance, sliding_window=W
        )
        assert set(full.forward) == set(full.step) == {"collective-permute"} and full.exact and windowed.exact
        # forward: K and V once per hop; full causal forward + backward: K, V, dK, dV per hop, dK, dV home
        for row in (full, windowed):
            assert row.forward["collective-permute"] == (2 * row.hops, 2 * row.hops * KV_BYTES)
        assert full.step["collective-permute"] == (6 * (N - 1) + 2, (6 * (N - 1) + 2) * KV_BYTES)
        assert windowed.sent("step") <= (6 * windowed.hops + 2) * KV_BYTES < full.sent("step")
        assert bench.hop_bytes(full, windowed.hops) == (
            2 * windowed.hops * KV_BYTES,
            (6 * windowed.hops + 2) * KV_BYTES,
        )
        # the ring's per-device tiles are the kernel's replay of its schedule
        work = kernels.causal_block_work(T, num_shards=N, block_size=BLOCK, balance=balance, sliding_window=W)
        assert windowed.tiles == tuple(work) and max(windowed.tiles) < max(full.tiles)
    # contiguous shards of 64: the window reaches one shard back; zig-zag (chunks 32) reaches
    # two chunks back, and its late chunks meet their neighbours' at steps N - 2, N - 1
    assert rows[(None, W)].hops == 1 and rows[("zigzag", W)].steps == (0, 1, 2, 6, 7)
    assert rows[("zigzag", W)].sent("step") == (6 * 4 + 2) * KV_BYTES  # after a loop of 2 trips: no K/V send merged
    assert [g.status for g in result["goals"][1:]] == ["PASS", "PASS"]


def test_report_lists_every_row(tiny):
    _, lines = tiny
    text = lines[-1]
    assert "| W | tiles planned | tiles counted | tiles touched |" in text
    assert "| ring | zigzag | 40 | 0,1,2,6,7 | 4 |" in text and "| ring | none | full causal | all | 7 |" in text
    assert text.count("- PASS: ") == 3


def test_gather_and_ulysses_send_the_same_with_a_window():
    settings = WindowBenchSettings(
        **TINY, sections=("context",), context_attentions=("gather", "ulysses"), balances=("zigzag",)
    )
    result = run(settings, [])
    rows = {(r.kernel, r.window): r for r in result["context"]}
    assert result["goals"] == []
    for kernel, kinds in (("gather", {"all-gather", "reduce-scatter"}), ("ulysses", {"all-to-all"})):
        full, windowed = rows[(kernel, None)], rows[(kernel, W)]
        assert set(full.step) == kinds and full.step == windowed.step and windowed.forward is None
        assert max(windowed.tiles) < max(full.tiles)
    # all-gather: K and V of the other N - 1 shards, whatever the window; dK, dV reduce-scattered back
    gathered = rows[("gather", W)].step
    assert gathered["all-gather"] == (2, 2 * (N - 1) * KV_BYTES) and gathered["reduce-scatter"] == (
        2,
        2 * (N - 1) * KV_BYTES,
    )
    # Ulysses: H / N = 1 head per device over all T tokens, each tile one head
    ulysses = rows[("ulysses", W)]
    assert ulysses.tile_heads == 1 and ulysses.tiles == (_ulysses_tiles(),) * N


def _ulysses_tiles():
    positions = kernels.permutation(T, num_shards=N, balance="zigzag")
    plan = kernels.blockwise_tiles(
        T, block_size=BLOCK, causal=True, sliding_window=W, q_positions=positions, k_positions=positions
    )
    return int(plan.sum())


def test_goal_misses_when_a_windowed_hop_sends_more():
    settings = WindowBenchSettings(**TINY, balances=(None,))
    full = bench.ContextRow(
        "ring",
        None,
        None,
        tuple(range(N)),
        {"collective-permute": (14, 14.0)},
        {"collective-permute": (44, 44.0)},
        1,
        (1,),
        HEADS,
    )
    windowed = dataclasses.replace(
        full, window=W, steps=(0, 1), forward={"collective-permute": (2, 2.0)}, step={"collective-permute": (8, 8.0)}
    )
    assert [g.status for g in bench.evaluate_goals(settings, [], [full, windowed])] == ["PASS"]
    windowed.forward = {"collective-permute": (2, 3.0)}  # a hop sending more than a full-causal one
    assert [g.status for g in bench.evaluate_goals(settings, [], [full, windowed])] == ["MISS"]
    windowed.forward, windowed.step = {"collective-permute": (2, 2.0)}, {"collective-permute": (9, 9.0)}
    assert [g.status for g in bench.evaluate_goals(settings, [], [full, windowed])] == ["MISS"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"devices": 16}, "needs 16 devices but JAX has 8"),
        ({"context_length": 520}, "520"),
        ({"heads": 4, "kv_heads": 2}, "4"),
        ({"kv_heads": 3}, "kv_heads 3 must divide heads 8"),
    ],
)
def test_bad_settings_are_refused_before_any_work(change, message):
    with pytest.raises(ValueError, match=message):
        run(WindowBenchSettings(**{**TINY, **change}), [])


def _parse(argv):
    return parse_bench_args("window", argv)


def test_cli_flags_cover_the_config_and_keep_its_defaults():
    assert bench_cli.settings_from_args("window", _parse([])) == WindowBenchSettings()
    args = _parse(
        [
            "--balances",
            "None,zigzag,striped",
            "--context-attentions",
            "ring",
            "--sections",
            "context",
            "--sliding-window",
            "8",
        ]
    )
    settings = bench_cli.settings_from_args("window", args)
    assert (settings.balances, settings.context_attentions, settings.sections, settings.sliding_window) == (
        (None, "zigzag", "striped"),
        ("ring",),
        ("context",),
        8,
    )
    assert set(vars(args)) - {"bench", "func", "simulate_devices"} == {
        f.name for f in dataclasses.fields(WindowBenchSettings)
    }
    with pytest.raises(SystemExit):
        _parse(["--balances", "spiral"])
