"""Sliding-window attention (W keys up to and including the query's own position) in every kernel.

Every kernel against the masked reference, outputs and gradients, with windows smaller
than, equal to and larger than a shard; the tiles the blockwise kernel visits against
the tiles a window touches; the ring steps (and ppermutes) a window drops.

Shapes: T = 32 over a seq axis of N = 4, so a shard holds L = 8 tokens; W = 3, 8, 12.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import (
    attention_reference,
    blockwise_attention,
    blockwise_tiles,
    causal_block_work,
    gather_kv_attention,
    ring_attention,
    ring_attention_tiles,
    ring_steps,
    ulysses_attention,
)
from zoo.kernels._masking import attention_mask

N, T, HEADS, KV_HEADS, HEAD_DIM = 4, 32, 4, 2, 8
SHARD = T // N
WINDOWS = {"below-shard": 3, "shard": SHARD, "above-shard": SHARD + 4}

# (kernel, options, balance, devices); None devices: single-device blockwise.
KERNELS = {
    "blockwise": (blockwise_attention, {"block_size": 4}, None, None),
    "ring": (ring_attention, {"block_size": 4}, None, N),
    "ring-zigzag": (ring_attention, {"block_size": 2}, "zigzag", N),
    "ring-striped": (ring_attention, {"block_size": 4}, "striped", N),
    "gather": (gather_kv_attention, {"block_size": 4}, None, N),
    "ulysses-zigzag": (ulysses_attention, {"block_size": 8}, "zigzag", N),
}


def _inputs():
    return h.inputs(heads=HEADS, kv_heads=KV_HEADS, length=T, head_dim=HEAD_DIM)


@functools.cache
def _references():
    """{window name: (out, dq, dk, dv)} of the masked reference, all windows in one program."""
    attentions = [h.reference(causal=True, sliding_window=window) for window in WINDOWS.values()]
    return dict(zip(WINDOWS, h.outputs_and_grads(attentions, *_inputs())))


def _assert_matches(got, window_name):
    names = tuple(f"{x} (W={WINDOWS[window_name]})" for x in ("out", "dq", "dk", "dv"))
    h.assert_close(got, _references()[window_name], rtol=1e-4, atol=1e-5, names=names)


def _attention(name, window):
    kernel, options, balance, devices = KERNELS[name]
    if devices is None:
        return lambda q, k, v, key_mask: kernel(
            q, k, v, causal=True, key_mask=key_mask, sliding_window=window, **options
        )
    return h.sharded(kernel, n=devices, balance=balance, causal=True, sliding_window=window, **options)


def test_mask_is_transformers_sliding_window():
    """p - W < k <= p, as transformers' sliding_window_causal_mask_function builds it."""
    q_pos, k_pos = jnp.arange(10), jnp.arange(10)
    got = np.asarray(attention_mask(q_positions=q_pos, k_positions=k_pos, causal=True, sliding_window=3))[0, 0, 0]
    q_idx, kv_idx = np.arange(10)[:, None], np.arange(10)[None, :]
    np.testing.assert_array_equal(got, (kv_idx > q_idx - 3) & (kv_idx <= q_idx))


def test_reference_matches_jax_local_window():
    """jax.nn.dot_product_attention's local_window_size=(W - 1, 0) is the same window (what cuDNN gets)."""
    q, k, v, _, cotangent = _inputs()
    window = WINDOWS["below-shard"]

    def theirs(q, k, v, key_mask):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(window - 1, 0))

    ours = h.reference(causal=True, sliding_window=window)
    h.assert_close(
        h.output_and_grads(ours, q, k, v, None, cotangent),
        h.output_and_grads(theirs, q, k, v, None, cotangent),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_matches_masked_reference(kernel):
    """Outputs and dq, dk, dv for every window (one program per kernel); with padding, so
    example 0's first 5 rows see no key at all."""
    got = h.outputs_and_grads([_attention(kernel, window) for window in WINDOWS.values()], *_inputs())
    for window_name, result in zip(WINDOWS, got):
        _assert_matches(result, window_name)


def test_ring_on_two_devices_with_a_window_inside_a_shard():
    window = WINDOWS["above-shard"]  # 12 < 16, the shard on N = 2
    attention = h.sharded(ring_attention, n=2, causal=True, sliding_window=window, block_size=4)
    _assert_matches(h.output_and_grads(attention, *_inputs()), "above-shard")


# --- the tiles the blockwise kernel visits -------------------------------------------------


def _touched_tiles(length, window, tile):
    """Tiles holding a visible (query, key) pair, from the element mask, not from the kernel's test.

    The window is translation-invariant, so a tile's fate depends only on (query tile -
    key tile); the last query tile row meets every offset: mask it element by element.
    """
    queries = np.arange(length - tile, length)[:, None]  # the last query tile
    keys = np.arange(length)[None, :]
    visible = (keys > queries - window) & (keys <= queries)  # bool[tile, T]
    offsets = np.flatnonzero(visible.reshape(tile, -1, tile).any(axis=(0, 2))[::-1])  # query tile - key tile
    rows = length // tile
    return sum(int(np.sum(offsets <= row)) for row in range(rows))


def test_blockwise_visits_only_the_tiles_the_window_touches():
    length, window, tile = 32 * 1024, 4 * 1024, 512
    plan = blockwise_tiles(length, block_size=tile, causal=True, sliding_window=window)  # bool[64, 64]
    computed, touched = int(plan.sum()), _touched_tiles(length, window, tile)
    full_causal = int(blockwise_tiles(length, block_size=tile, causal=True).sum())
    rows = length // tile
    assert full_causal == rows * (rows + 1) // 2
    assert touched <= computed <= 1.2 * touched, (computed, touched)
    assert computed * 3 < full_causal, (computed, full_causal)  # O(T x W), not O(T^2)
    # and every row visits at most W / tile + 1 key tiles
    assert plan.sum(axis=1).max() == window // tile + 1


def test_kernel_tile_loops_run_the_plan():
    """The windowed loops' own count (ring on one device = blockwise over all keys), and per device on 4."""
    window, block = WINDOWS["above-shard"], 4
    q, k, v, _, _ = h.inputs(heads=2, kv_heads=2, length=T, head_dim=HEAD_DIM, masked=False)

    def counts(n, balance):
        count = functools.partial(
            ring_attention_tiles,
            axis_name=h.AXIS,
            causal=True,
            block_size=block,
            balance=balance,
            sliding_window=window,
        )
        per_device = jax.P(h.AXIS)
        f = jax.shard_map(
            lambda q, k, v: count(q, k, v)[None], mesh=h.mesh_of(n), in_specs=(h.SEQ,) * 3, out_specs=per_device
        )
        return np.asarray(jax.jit(f, compiler_options=h.FAST_COMPILE)(q, k, v))

    assert counts(1, None).tolist() == [blockwise_tiles(T, block_size=block, causal=True, sliding_window=window).sum()]
    expected = causal_block_work(T, num_shards=N, block_size=block, balance="zigzag", sliding_window=window)
    np.testing.assert_array_equal(counts(N, "zigzag"), expected)


# --- the ring steps (and ppermutes) a window drops -----------------------------------------


@pytest.mark.parametrize(
    "seq_len, num_shards, window",
    [(32, 4, 3), (32, 4, 8), (32, 4, 9), (32, 4, 12), (32, 4, 17), (32, 4, 31), (4096, 8, 1000), (32 * 1024, 8, 4096)],
)
def test_contiguous_shards_need_the_steps_the_window_reaches(seq_len, num_shards, window):
    """Shard i's first query reaches shard i - s iff (s - 1) L + 1 < W: steps 0 .. ceil((W - 1) / L)."""
    shard = seq_len // num_shards
    last = min(num_shards - 1, -(-(window - 1) // shard))
    assert ring_steps(seq_len, num_shards=num_shards, block_size=64, sliding_window=window) == tuple(range(last + 1))


def test_ring_steps_without_a_window_or_with_balancing():
    assert ring_steps(T, num_shards=N) == (0, 1, 2, 3)
    # zig-zag: shard i's late chunk meets its ring neighbours' in reverse (step N - 1)
    assert ring_steps(T, num_shards=N, block_size=2, balance="zigzag", sliding_window=3) == (0, 1, 3)
    assert ring_steps(T, num_shards=N, block_size=2, balance="zigzag", sliding_window=SHARD) == (0, 1, 2, 3)


@pytest.mark.parametrize(
    "balance, window, hops",
    [(None, None, 3), (None, WINDOWS["shard"], 1), (None, WINDOWS["above-shard"], 2), ("zigzag", 3, 2), (None, 1, 0)],
)
def test_ring_sends_fewer_ppermutes_with_a_window(balance, window, hops):
    """Forward + backward, traced only: K, V per hop forward; K, V and dK, dV per hop backward, dK, dV home."""
    q, k, v, _, cotangent = h.inputs(heads=2, kv_heads=2, length=T, head_dim=HEAD_DIM, masked=False)
    attention = h.sharded(ring_attention, n=N, balance=balance, causal=True, block_size=2, sliding_window=window)

    def step(q, k, v, cotangent):
        out, pullback = jax.vjp(lambda q, k, v: attention(q, k, v, None), q, k, v)
        return pullback(cotangent)

    assert hops == len(ring_steps(T, num_shards=N, block_size=2, balance=balance, sliding_window=window)) - 1
    expected = 2 * hops + (4 * hops + 2 if hops else 0)
    assert h.executions(jax.jit(step).trace(q, k, v, cotangent).jaxpr, "ppermute") == expected
    if hops == 0:  # nothing left to send: the lowered program has no collective-permute at all
        assert "collective_permute" not in jax.jit(step).lower(q, k, v, cotangent).as_text()


NOT_AN_INT = "sliding_window must be a positive int or None, got"
SHARDED = dict(axis_name=h.AXIS)  # the window is checked before the kernel asks for the axis


@pytest.mark.parametrize(
    "kernel, kwargs, message",
    [
        (attention_reference, dict(causal=False, sliding_window=4), "sliding_window=4 needs causal=True"),
        (blockwise_attention, dict(causal=True, sliding_window=0), r"sliding_window must be >= 1 .* got 0$"),
        (blockwise_attention, dict(causal=True, sliding_window=2.5), f"{NOT_AN_INT} 2.5$"),
        (attention_reference, dict(causal=True, sliding_window=True), f"{NOT_AN_INT} True$"),
        (ring_attention, dict(SHARDED, sliding_window=8), "sliding_window=8 needs causal=True"),
        (gather_kv_attention, dict(SHARDED, causal=True, sliding_window=-2), "got -2$"),
        (ulysses_attention, dict(SHARDED, causal=True, sliding_window="8"), f"{NOT_AN_INT} '8'$"),
    ],
)
def test_bad_windows_are_refused(kernel, kwargs, message):
    q = jnp.zeros((1, 8, 2, 4))
    with pytest.raises(ValueError, match=message):
        kernel(q, q, q, **kwargs)
