"""``zoo bench window``: what a sliding window W saves in every attention kernel, compile-only.

Everything is counted through the kernels' own code paths, nothing is timed; the causal
kernels run with ``sliding_window=W`` beside the same kernels at full causal attention.

**Blockwise** (one device, T = ``blockwise_length``): the score tiles the kernel computes,
three ways: its plan (``kernels.blockwise_tiles``, the kernel's own tile sizes and skip
test in numpy), the count carried through its tile loops (``kernels.ring_attention_tiles``
on a seq axis of one device: the same ``_ring_blocks.forward_shard`` loops with the same
tiles, run at H = K = 1, D = 8 since the count depends only on T, the tile and W), and
the tiles that hold a visible (query, key) pair by the element mask p - W < k <= p (the
window's own, independent of the kernel's test). Per-device temporary memory of the
forward + backward (``jax.vjp``) of ``kernels.blockwise_attention`` at the real head
config, compiled from ``jax.ShapeDtypeStruct``s (``memory_analysis()``), never run.
Goal (issue 28): tiles computed <= 1.2 x the tiles the window touches.

**Context** (T = ``context_length`` over a ``seq`` axis of N simulated devices): ring,
all-gather and Ulysses as ``MultiHeadAttention`` dispatches them
(``zoo.layers.sharded_attention``), forward + backward (and the
ring's forward alone), compiled for N devices and never run. The collectives and their bytes are
read from the compiled HLO by ``zoo.measure.comms_report`` (the project's one HLO
parser), each counted as often as the known trip counts of the loops around it say.
Ring hops: ``kernels.ring_steps`` (the steps the kernel keeps, from its own tiles and
positions) minus one. Local tiles per device: the kernels' plans (``causal_block_work``
for the ring, ``blockwise_tiles`` with each kernel's positions for the local step of
gather and Ulysses), the largest over devices; a ring or gather tile spans H heads, a
Ulysses tile H/N. Goal (issue 28): the ring's bytes fall in proportion to the hops
skipped, each hop moving what a full-causal hop moves (``hop_bytes``): forward bytes
exactly hops x one hop's K/V; forward + backward at most hops x (K/V twice + dK/dV) +
the one send of dK/dV home: equal, or less where XLA merged the backward's K/V sends
with the forward's (it does when every hop is a one-trip loop, which it unrolls).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zoo import kernels
from zoo.bench._output import publish, size_text
from zoo.config.bench_settings import WindowBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution import describe_devices, make_mesh
from zoo.distribution.axes import SEQ
from zoo.layers import run_on_mesh, sharded_attention
from zoo.measure.comms_report import FAST_COMPILE, compiled_report

COUNT_HEADS, COUNT_HEAD_DIM = 1, 8  # the tile-count run: the count does not depend on H, K or D
TILE_GOAL = 1.2  # tiles computed <= 1.2 x the tiles the window touches
LABELS = {"gather": "all-gather", "ring": "ring", "ulysses": "Ulysses"}


@dataclasses.dataclass
class Goal:
    name: str
    status: str  # "PASS" or "MISS"
    detail: str


@dataclasses.dataclass
class BlockwiseRow:
    """One window (None: full causal) of the blockwise kernel on one device."""

    window: int | None
    tile: int
    planned: int  # blockwise_tiles(...).sum(): the kernel's plan
    counted: int | None  # carried through the kernel's tile loops (None: the 1-device ring tiles differently)
    touched: int  # tiles holding a visible (query, key) pair, by the element mask
    pairs: int  # visible (query, key) pairs
    temp: int  # bytes, forward + backward
    argument: int


@dataclasses.dataclass
class ContextRow:
    """One kernel x balance x window (None: full causal) on N devices."""

    kernel: str
    balance: str | None
    window: int | None
    steps: tuple | None  # ring: the ring steps kept (kernels.ring_steps); else None
    forward: dict | None  # ring: {kind: (executions, bytes sent per device)} of the forward alone; else None
    step: dict  # the same of forward + backward
    temp: int  # bytes per device, forward + backward
    tiles: tuple  # local score tiles per device (forward pass)
    tile_heads: int  # heads each tile spans
    exact: bool = True  # False: a loop without known trip count (bytes are lower bounds)

    @property
    def hops(self):
        return None if self.steps is None else len(self.steps) - 1

    def sent(self, program):
        """Bytes one device sends per call of ``program`` ("forward" or "step")."""
        return sum(sent for _, sent in (getattr(self, program) or {}).values())


def run_benchmark(settings, report=print):
    """Compile and count every row, check the goals; report markdown (``settings``:
    ``zoo.config.bench_settings.WindowBenchSettings``).

    Returns ``{"blockwise": [BlockwiseRow], "context": [ContextRow], "goals": [Goal]}``.
    """
    check_settings(settings)
    blockwise, context = [], []
    if "blockwise" in settings.sections:
        for window in (None, settings.sliding_window):
            blockwise.append(blockwise_row(settings, window))
            report(
                f"blockwise T={settings.blockwise_length} W={window}: {blockwise[-1].counted} tiles, temp {size_text(blockwise[-1].temp)}"
            )
    if "context" in settings.sections:
        for kernel in settings.context_attentions:
            for balance in settings.balances:
                for window in (None, settings.sliding_window):
                    context.append(context_row(settings, kernel, balance, window))
                    row = context[-1]
                    report(
                        f"{kernel} balance={balance} W={window}: sent {size_text(row.sent('step'))}, hops {row.hops}"
                    )
    goals = evaluate_goals(settings, blockwise, context)
    text = format_report(settings, blockwise, context, goals)
    publish(text, settings, report)
    return {"blockwise": blockwise, "context": context, "goals": goals}


def check_settings(settings):
    if not 1 <= settings.kv_heads <= settings.heads or settings.heads % settings.kv_heads:
        raise ValueError(f"kv_heads {settings.kv_heads} must divide heads {settings.heads}")
    if "context" not in settings.sections:
        return
    if settings.devices > len(jax.devices()):
        raise ValueError(
            f"the context table needs {settings.devices} devices but JAX has {len(jax.devices())}; "
            f"run with --simulate-devices {settings.devices} or pass a smaller --devices"
        )
    for balance in settings.balances:
        kernels.check_sequence_divisible(settings.context_length, axis_size=settings.devices, balance=balance)
    if "ulysses" in settings.context_attentions:
        kernels.check_heads_divisible(settings.heads, axis_size=settings.devices, axis_name=SEQ)


# --- blockwise -----------------------------------------------------------------------------


def blockwise_row(settings, window):
    length, block = settings.blockwise_length, settings.block_size
    tile = kernels.tile_plan(length, block)[0]
    planned = int(kernels.blockwise_tiles(length, block_size=block, causal=True, sliding_window=window).sum())
    same_tiles = kernels.tile_plan(length, block) == (kernels.block_size_for(length, block), length)
    counted = counted_tiles(length, block, window) if same_tiles else None
    analysis = _blockwise_program(settings, window).memory_analysis()
    return BlockwiseRow(
        window,
        tile,
        planned,
        counted,
        touched_tiles(length, tile, window),
        visible_pairs(length, window),
        analysis.temp_size_in_bytes,
        analysis.argument_size_in_bytes,
    )


def _blockwise_program(settings, window):
    """The compiled forward + backward of ``blockwise_attention`` on one device (never run)."""
    q = jax.ShapeDtypeStruct(
        (settings.batch, settings.blockwise_length, settings.heads, settings.head_dim), settings.dtype
    )
    kv = jax.ShapeDtypeStruct(
        (settings.batch, settings.blockwise_length, settings.kv_heads, settings.head_dim), settings.dtype
    )
    attention = functools.partial(
        kernels.blockwise_attention, causal=True, block_size=settings.block_size, sliding_window=window
    )
    return jax.jit(_forward_backward(attention)).lower(q, kv, kv, q).compile(FAST_COMPILE)


def counted_tiles(length, block, window):
    """Tiles computed, carried through the kernel's tile loops: ``ring_attention_tiles`` on
    a seq axis of one device (the blockwise loops over all T keys) at H = K = 1, D = 8."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), (SEQ,))
    spec = P(None, SEQ)
    x = jnp.zeros((1, length, COUNT_HEADS, COUNT_HEAD_DIM), jnp.float32)
    tiles = run_on_mesh(mesh, _count_tiles, (x, x, x), (spec,) * 3, P(SEQ), block_size=block, sliding_window=window)
    return int(tiles[0])


def _count_tiles(q, k, v, *, block_size, sliding_window):
    """The ``shard_map`` body of ``counted_tiles``: i32[1] tiles of this shard."""
    count = kernels.ring_attention_tiles(
        q, k, v, axis_name=SEQ, causal=True, block_size=block_size, sliding_window=sliding_window
    )
    return count[None]


def touched_tiles(length, tile, window):
    """Tiles (query tile, key tile) of edge ``tile`` holding a pair p - W < k <= p, from the
    element mask (W None: k <= p). The mask is translation-invariant, so a tile's fate
    depends only on (query tile - key tile), and the last query tile meets every offset."""
    window = length if window is None else window
    queries = np.arange(length - tile, length)[:, None]  # the last query tile
    keys = np.arange(length)[None, :]
    visible = (keys > queries - window) & (keys <= queries)  # bool[tile, T]
    offsets = np.flatnonzero(visible.reshape(tile, -1, tile).any(axis=(0, 2))[::-1])  # query tile - key tile
    return sum(int(np.sum(offsets <= row)) for row in range(length // tile))


def visible_pairs(length, window):
    """(query, key) pairs the mask keeps: sum over p of min(p + 1, W)."""
    window = length if window is None else min(window, length)
    return window * length - window * (window - 1) // 2


# --- context (sequence-parallel) ----------------------------------------------------------


def context_row(settings, kernel, balance, window):
    n, length = settings.devices, settings.context_length
    mesh = make_mesh(f"{SEQ}={n}", devices=jax.devices()[:n])
    sharding = NamedSharding(mesh.backend_mesh, P(None, SEQ))  # [B, T, heads, D] split along T
    q = jax.ShapeDtypeStruct(
        (settings.batch, length, settings.heads, settings.head_dim), settings.dtype, sharding=sharding
    )
    kv = jax.ShapeDtypeStruct(
        (settings.batch, length, settings.kv_heads, settings.head_dim), settings.dtype, sharding=sharding
    )
    attention = functools.partial(
        sharded_attention,
        mesh=mesh,
        spec=kernels.AttentionSpec(causal=True, sliding_window=window, block_size=settings.block_size),
        key_mask=None,
        context_attention=kernel,
        balance=balance,
        rope=None,
        sequence_axis=SEQ,
        batch_axis=None,
    )
    step = (
        jax.jit(_forward_backward(attention), out_shardings=(sharding,) * 3).lower(q, kv, kv, q).compile(FAST_COMPILE)
    )
    reports = [compiled_report(step, mesh.backend_mesh)]
    forward = None
    if kernel == "ring":  # the ring's forward alone: K/V once per hop, nothing else (the goal's exact part)
        reports.append(
            compiled_report(
                jax.jit(attention, out_shardings=sharding).lower(q, kv, kv).compile(FAST_COMPILE), mesh.backend_mesh
            )
        )
        forward = _by_kind(reports[1])
    steps = kernels.ring_steps(
        length, num_shards=n, block_size=settings.block_size, balance=balance, sliding_window=window
    )
    tiles, tile_heads = local_tiles(settings, kernel, balance, window)
    return ContextRow(
        kernel,
        balance,
        window,
        steps if kernel == "ring" else None,
        forward,
        _by_kind(reports[0]),
        reports[0].memory.temp_bytes,
        tiles,
        tile_heads,
        all(r.exact for r in reports),
    )


def _by_kind(report):
    kinds = {}
    for row in report.per_axis():
        count, sent = kinds.get(row["kind"], (0, 0.0))
        kinds[row["kind"]] = (count + row["count"], sent + row["sent_bytes"])
    return kinds


def local_tiles(settings, kernel, balance, window):
    """(tiles per device, heads per tile) of each kernel's forward pass, from its plan."""
    n, length, block = settings.devices, settings.context_length, settings.block_size
    local = length // n
    if kernel == "ring":
        work = kernels.causal_block_work(length, num_shards=n, block_size=block, balance=balance, sliding_window=window)
        return tuple(int(w) for w in work), settings.heads
    keys = None if balance is None else kernels.permutation(length, num_shards=n, balance=balance)
    if kernel == "ulysses":  # every device: all T queries and keys of H/N heads, in shard order
        plan = kernels.blockwise_tiles(
            length, block_size=block, causal=True, sliding_window=window, q_positions=keys, k_positions=keys
        )
        return (int(plan.sum()),) * n, settings.heads // n
    tiles = []  # gather: the shard's queries against all T keys
    for device in range(n):
        queries = kernels.shard_positions(local, shard_index=device, num_shards=n, balance=balance)
        plan = kernels.blockwise_tiles(
            local, length, block_size=block, causal=True, sliding_window=window, q_positions=queries, k_positions=keys
        )
        tiles.append(int(plan.sum()))
    return tuple(tiles), settings.heads


def _forward_backward(attention):
    """(q, k, v, d_out) -> (dq, dk, dv): one forward and one backward pass."""

    def step(q, k, v, d_out):
        _, pullback = jax.vjp(attention, q, k, v)
        return pullback(d_out)

    return step


# --- goals and report ----------------------------------------------------------------------


def evaluate_goals(settings, blockwise, context):
    """Issue 28's goals: blockwise tiles vs the window's, and per balance the ring's bytes vs its hops."""
    goals = []
    for row in (r for r in blockwise if r.window is not None):
        computed = row.planned if row.counted is None else row.counted
        ratio = computed / row.touched
        goals.append(
            Goal(
                f"blockwise tiles computed <= {TILE_GOAL} x the tiles the window touches (T={settings.blockwise_length}, W={row.window})",
                _status(ratio <= TILE_GOAL),
                f"{computed:,} vs {row.touched:,}: {ratio:.3f} x",
            )
        )
    rings = {(r.balance, r.window): r for r in context if r.kernel == "ring"}
    for balance in settings.balances:
        full, windowed = rings.get((balance, None)), rings.get((balance, settings.sliding_window))
        if full is None or windowed is None:
            continue
        forward_expected, step_expected = hop_bytes(full, windowed.hops)
        forward, step = windowed.sent("forward"), windowed.sent("step")
        proportional = abs(forward - forward_expected) <= 1e-6 * forward_expected and step <= step_expected * (1 + 1e-9)
        goals.append(
            Goal(
                f"ring bytes fall in proportion to the hops skipped (balance {balance}, T={settings.context_length}, "
                f"N={settings.devices}, W={settings.sliding_window}): forward = hops x one hop's K/V; forward + backward <= "
                "hops x (2 K/V + dK/dV) + one dK/dV home",
                _status(proportional),
                f"hops {windowed.hops} of {full.hops}; forward {size_text(forward)} (by hops {size_text(forward_expected)}); "
                f"forward + backward {size_text(step)} (by hops {size_text(step_expected)}, full causal {size_text(full.sent('step'))})",
            )
        )
    return goals


def hop_bytes(full, hops):
    """(forward, forward + backward) bytes the ring sends at ``hops`` hops, each hop as the
    full-causal row's: forward F per hop (K, V); backward F + G per hop (K, V with their
    f32 dK, dV accumulators) and G once more (dK, dV home), so the full row's
    forward + backward is 2 (N-1) F + N G with N - 1 = ``full.hops``."""
    if not full.hops:
        return 0.0, 0.0
    per_hop = full.sent("forward") / full.hops  # F
    home = (full.sent("step") - 2 * full.hops * per_hop) / (full.hops + 1)  # G
    return hops * per_hop, (2 * hops * per_hop + (hops + 1) * home) if hops else 0.0


def _status(ok):
    return "PASS" if ok else "MISS"


def _window_text(window):
    return "full causal" if window is None else f"{window:,}"


def _kinds_text(kinds):
    if kinds is None:
        return "-"
    if not kinds:
        return "none"
    parts = ", ".join(f"{count} {kind}" for kind, (count, _) in kinds.items())
    return f"{parts} ({size_text(sum(sent for _, sent in kinds.values()))})"


def format_report(settings, blockwise, context, goals):
    """Header, the two tables and the goals, as markdown."""
    heads = f"B={settings.batch}, H={settings.heads}, K={settings.kv_heads}, D={settings.head_dim}, {settings.dtype}, causal, block_size {settings.block_size}"
    lines = [
        f"devices: {describe_devices()}; {heads}; forward + backward; jax {jax.__version__}, keras {keras.__version__}"
    ]
    if blockwise:
        tile = blockwise[0].tile
        lines += [
            "",
            (
                f"Blockwise, one device, T={settings.blockwise_length:,}, tile {tile}: tiles planned (blockwise_tiles), counted by the "
                f"kernel's tile loops (H=K={COUNT_HEADS}, D={COUNT_HEAD_DIM}), touched by the window's element mask; pairs = (query, key) "
                "pairs kept; temp = memory_analysis of forward + backward, compiled, never run:"
            ),
            "",
            "| W | tiles planned | tiles counted | tiles touched | computed / touched | tiles / full causal | tile pairs / kept pairs | temp | arguments |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        full = next((r for r in blockwise if r.window is None), blockwise[0])
        for row in blockwise:
            computed = row.planned if row.counted is None else row.counted
            counted = "-" if row.counted is None else f"{row.counted:,}"
            lines.append(
                f"| {_window_text(row.window)} | {row.planned:,} | {counted} | {row.touched:,} | {computed / row.touched:.3f} | "
                f"{computed / (full.planned if full.counted is None else full.counted):.3f} | "
                f"{computed * row.tile**2 / row.pairs:.3f} | {size_text(row.temp)} | {size_text(row.argument)} |"
            )
    if context:
        lines += [
            "",
            (
                f"Context, T={settings.context_length:,} over seq={settings.devices} ({settings.context_length // settings.devices:,} tokens per "
                "device), compiled, never run: collectives per device from the compiled HLO (loop trip counts included), bytes = what "
                "one device sends; hops = ring steps kept - 1; tiles = the forward's local score tiles per device (largest; smallest "
                "in brackets), each spanning the heads given; temp = forward + backward:"
            ),
            "",
            "| kernel | balance | W | ring steps kept | hops | forward: collectives (sent) | forward + backward: collectives (sent) "
            "| sent / full causal | hops / full causal | local tiles / device | heads / tile | temp |",
            "| --- | --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        fulls = {(r.kernel, r.balance): r for r in context if r.window is None}
        for row in context:
            full = fulls.get((row.kernel, row.balance), row)
            sent = row.sent("step") / full.sent("step") if full.sent("step") else 1.0
            steps = "-" if row.steps is None else ("all" if row.window is None else ",".join(map(str, row.steps)))
            hops = "-" if row.hops is None else row.hops
            hop_ratio = f"{row.hops / full.hops:.3f}" if row.hops is not None and full.hops else "-"
            tiles = f"{max(row.tiles):,}" + ("" if min(row.tiles) == max(row.tiles) else f" ({min(row.tiles):,})")
            bound = "" if row.exact else " (lower bound)"
            lines.append(
                f"| {LABELS[row.kernel]} | {row.balance or 'none'} | {_window_text(row.window)} | {steps} | {hops} | "
                f"{_kinds_text(row.forward)} | {_kinds_text(row.step)}{bound} | {sent:.3f} | {hop_ratio} | {tiles} | "
                f"{row.tile_heads} | {size_text(row.temp)} |"
            )
    lines += ["", "Goals:", ""] + [f"- {g.status}: {g.name}: {g.detail}" for g in goals]
    return "\n".join(lines)
