"""``zoo bench attention``: per-device memory and time of sequence-parallel attention.

Four ways to run causal self-attention, forward + backward (``jax.vjp``: dq, dk, dv
from a cotangent), on a sequence split over a ``seq`` mesh axis of N devices:

- **GSPMD reference**: ``kernels.attention_reference`` (materialised f32 scores) under
  plain ``jax.jit`` with sequence-sharded inputs; XLA's partitioner decides the
  communication. (The layer's own plain path is now the blockwise kernel; this column
  keeps the materialising baseline the goals were set against.)
- **all-gather**, **ring** (load-balanced, tiled, custom VJP) and **Ulysses**: the
  ``shard_map`` kernels, dispatched by ``MultiHeadAttention``'s own code path
  (``zoo.layers.sharded_attention``), so what is measured is what the layer runs.

Memory: every program is compiled ahead of time from ``jax.ShapeDtypeStruct`` inputs
carrying their shardings (nothing is allocated, so T = 64k compiles on a laptop) and
``compiled.memory_analysis()`` gives per-device temporary, argument and output bytes.

Time: programs at the sizes in ``time_lengths`` (and the goal size) are run on real
arrays, kernels alternating, ``repeats`` times after one warm-up run each; the
median wall and process-CPU seconds are reported as ratios against the reference
(or against all-gather) measured in the same run. A timing whose N devices together
would need more than ``memory_limit_gib`` of host memory (from the memory analysis)
is skipped and says so.

Goals (issue 4): ring at the largest T and N uses <= 1/8 of the reference's per-device
temporary memory; ring at N = 8 uses <= 0.6 x its own memory at N = 4; ring time <=
all-gather time at T = 16k.
"""

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zoo import kernels
from zoo.bench._output import mib_text, publish
from zoo.config.bench_settings import AttentionBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.choices import CONTEXT_ATTENTIONS
from zoo.distribution import describe_devices, make_mesh
from zoo.distribution.axes import SEQ
from zoo.layers import sharded_attention
from zoo.units import GIB, format_bytes_in

AXIS = SEQ
KERNELS = ("reference", *CONTEXT_ATTENTIONS)  # the materialising reference, then the context_attention kernels
LABELS = {"reference": "GSPMD reference", "gather": "all-gather", "ring": "ring", "ulysses": "Ulysses"}


@dataclasses.dataclass
class Goal:
    name: str
    status: str  # "PASS", "MISS" or "NOT MEASURED"
    detail: str


def run_benchmark(settings, report=print):
    """Compile every program, time the small ones, check the goals; report markdown
    (``settings``: ``zoo.config.bench_settings.AttentionBenchSettings``; ``settings.plot``: also
    the memory-vs-T chart).

    Returns ``{"memory": [rows], "time": [rows], "goals": [Goal]}``.
    """
    check_settings(settings)
    programs = {}  # (kernel, T, H, N) -> (compiled, input sharding, memory)
    memory = [memory_row(settings, t, n, programs, report) for t in settings.lengths for n in settings.devices]
    timings = [
        time_row(settings, t, settings.heads, n, KERNELS, programs, report)
        for t in settings.time_lengths
        for n in settings.devices
    ]
    goal_size = (settings.goal_length, settings.goal_heads, settings.goal_devices)
    goal_timing = time_row(settings, *goal_size, ("gather", "ring"), programs, report)
    goals = evaluate_goals(settings, memory, goal_timing)
    text = format_report(settings, memory, timings + [goal_timing], goals)
    publish(text, settings, report)
    if settings.plot:
        from zoo.plotting import plot_attention_memory

        plot_attention_memory(memory, settings.plot, labels=LABELS, title=_plot_title(settings))
    return {"memory": memory, "time": timings + [goal_timing], "goals": goals}


def _plot_title(settings):
    return (
        f"Attention forward + backward, per-device temporary memory (B={settings.batch}, H={settings.heads}, "
        f"D={settings.head_dim}, f32, {'causal' if settings.causal else 'non-causal'})"
    )


def check_settings(settings):
    for name in ("heads", "head_dim", "batch", "block_size", "repeats", "goal_length", "goal_heads", "goal_devices"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name in ("lengths", "devices", "time_lengths"):
        values = tuple(getattr(settings, name))
        if not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{name} must be non-empty positive integers, got {values!r}")
    needed = max((*settings.devices, settings.goal_devices))
    if needed > len(jax.devices()):
        raise ValueError(
            f"the benchmark needs {needed} devices (largest N) but JAX has {len(jax.devices())}; "
            f"run with --simulate-devices {needed} or pass smaller --devices"
        )
    multiple = 2 if settings.balance == "zigzag" else 1
    for length in (*settings.lengths, *settings.time_lengths, settings.goal_length):
        for n in (*settings.devices, settings.goal_devices):
            if length % (multiple * n):
                raise ValueError(
                    f"sequence length {length} is not divisible by {multiple} x N = {multiple * n} devices"
                )


def attention_fn(kernel, mesh, settings):
    """(q, k, v) -> out on global [B, T, H, D] arrays, as the layer runs ``kernel`` on ``mesh``."""

    def attention(q, k, v):
        if kernel == "reference":  # the materialising reference: the baseline the kernels are measured against
            return kernels.attention_reference(q, k, v, causal=settings.causal)
        return sharded_attention(
            q,
            k,
            v,
            mesh=mesh,
            spec=kernels.AttentionSpec(causal=settings.causal, block_size=settings.block_size),
            key_mask=None,
            context_attention=kernel,
            balance=settings.balance if kernel == "ring" else None,
            rope=None,
            sequence_axis=AXIS,
            batch_axis=None,
        )

    return attention


def forward_backward(attention):
    """(q, k, v, d_out) -> (dq, dk, dv): one forward and one backward pass."""

    def step(q, k, v, d_out):
        _, pullback = jax.vjp(attention, q, k, v)
        return pullback(d_out)

    return step


def compile_program(settings, kernel, length, heads, n, programs):
    """The compiled forward + backward program (cached in ``programs``) and its memory."""
    key = (kernel, length, heads, n)
    if key not in programs:
        mesh = make_mesh(f"{AXIS}={n}", devices=jax.devices()[:n])
        sharding = NamedSharding(mesh.backend_mesh, P(None, AXIS))  # [B, T, H, D] split along T
        spec = jax.ShapeDtypeStruct((settings.batch, length, heads, settings.head_dim), jnp.float32, sharding=sharding)
        step = forward_backward(attention_fn(kernel, mesh, settings))
        compiled = jax.jit(step, out_shardings=(sharding,) * 3).lower(spec, spec, spec, spec).compile()
        analysis = compiled.memory_analysis()
        memory = {
            "temp": analysis.temp_size_in_bytes,
            "argument": analysis.argument_size_in_bytes,
            "output": analysis.output_size_in_bytes,
        }
        programs[key] = (compiled, sharding, memory)
    return programs[key]


def memory_row(settings, length, n, programs, report):
    """Per-device temporary bytes of each kernel at (T, N); Ulysses None if H % N."""
    row = {"length": length, "devices": n, "temp": {}, "argument": {}}
    for kernel in KERNELS:
        if kernel == "ulysses" and settings.heads % n:
            row["temp"][kernel] = None
            continue
        _, _, memory = compile_program(settings, kernel, length, settings.heads, n, programs)
        row["temp"][kernel] = memory["temp"]
        row["argument"][kernel] = memory["argument"]
    cells = ", ".join(f"{s} {mib_text(b)}" for s, b in row["temp"].items())
    report(f"memory T={length} N={n}: {cells}")
    return row


def time_row(settings, length, heads, n, timed, programs, report):
    """Median wall and CPU seconds per kernel of ``timed`` at (T, H, N); skipped ones carry a reason."""
    row = {"length": length, "heads": heads, "devices": n, "wall": {}, "cpu": {}, "skipped": {}}
    runnable = {}
    for kernel in timed:
        reason = _skip_reason(settings, kernel, length, heads, n, programs)
        if reason:
            row["skipped"][kernel] = reason
        else:
            runnable[kernel] = programs[(kernel, length, heads, n)]
    if runnable:
        report(f"timing T={length} H={heads} N={n}: {', '.join(runnable)} ({settings.repeats} runs each) ...")
        row["wall"], row["cpu"] = _time_programs(runnable, settings, length, heads, n)
    for kernel, reason in row["skipped"].items():
        report(f"  {kernel} not timed: {reason}")
    return row


def _skip_reason(settings, kernel, length, heads, n, programs):
    if kernel == "ulysses" and heads % n:
        return f"{heads} heads do not split over N = {n}"
    _, _, memory = compile_program(settings, kernel, length, heads, n, programs)
    host = n * (2 * memory["argument"] + memory["temp"])  # inputs, same-sized grads, temporaries
    if host > settings.memory_limit_gib * GIB:
        return f"needs {format_bytes_in(host, GIB, 1)} GiB of host memory for N = {n} devices > limit {settings.memory_limit_gib:g} GiB"
    return None


def _time_programs(runnable, settings, length, heads, n):
    sharding = next(iter(runnable.values()))[1]
    rng = np.random.default_rng(0)
    shape = (settings.batch, length, heads, settings.head_dim)
    arrays = [jax.device_put(rng.standard_normal(shape, dtype=np.float32), sharding) for _ in range(4)]
    wall = {s: [] for s in runnable}
    cpu = {s: [] for s in runnable}
    for compiled, _, _ in runnable.values():  # warm-up
        jax.block_until_ready(compiled(*arrays))
    for _ in range(settings.repeats):  # alternate, so drifts in machine load hit all alike
        for kernel, (compiled, _, _) in runnable.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(compiled(*arrays))  # one program in flight at a time
            wall[kernel].append(time.perf_counter() - start_wall)
            cpu[kernel].append(time.process_time() - start_cpu)
    return {s: statistics.median(v) for s, v in wall.items()}, {s: statistics.median(v) for s, v in cpu.items()}


def evaluate_goals(settings, memory, goal_timing):
    """The three goals of issue 4, each PASS, MISS or NOT MEASURED with its numbers."""
    by_size = {(row["length"], row["devices"]): row["temp"] for row in memory}
    length, n_max, n_min = max(settings.lengths), max(settings.devices), min(settings.devices)
    top = by_size[(length, n_max)]
    ratio = top["ring"] / top["reference"]
    goals = [
        Goal(
            f"ring memory <= 1/8 of GSPMD reference (T={length}, N={n_max})",
            _status(ratio <= 1 / 8),
            f"{mib_text(top['ring'])} vs {mib_text(top['reference'])}: {ratio:.4f} x",
        )
    ]
    if n_max != n_min:
        scaling = top["ring"] / by_size[(length, n_min)]["ring"]
        goals.append(
            Goal(
                f"ring memory at N={n_max} <= 0.6 x at N={n_min} (T={length})",
                _status(scaling <= 0.6),
                f"{mib_text(top['ring'])} vs {mib_text(by_size[(length, n_min)]['ring'])}: {scaling:.3f} x",
            )
        )
    name = f"ring time <= all-gather time (T={goal_timing['length']}, H={goal_timing['heads']}, N={goal_timing['devices']})"
    wall = goal_timing["wall"]
    if "ring" in wall and "gather" in wall:
        speed = wall["ring"] / wall["gather"]
        detail = f"{_seconds(wall['ring'])} vs {_seconds(wall['gather'])}: {speed:.3f} x"
        goals.append(Goal(name, _status(speed <= 1.0), detail))
    else:
        goals.append(Goal(name, "NOT MEASURED", "; ".join(f"{s}: {r}" for s, r in goal_timing["skipped"].items())))
    return goals


def _status(ok):
    return "PASS" if ok else "MISS"


def _seconds(value):
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.1f} ms"


def format_report(settings, memory, timings, goals):
    """Header, memory table, time table and goals, as markdown."""
    lines = [
        (
            f"devices: {describe_devices()}; B={settings.batch}, H=K={settings.heads}, D={settings.head_dim}, float32, "
            f"{'causal' if settings.causal else 'non-causal'}, forward + backward; ring block {settings.block_size}, "
            f"balance {settings.balance}; jax {jax.__version__}, keras {keras.__version__}"
        ),
        "",
        "Per-device temporary memory (compiled memory analysis):",
        "",
        f"| T | N | GSPMD reference | all-gather | ring | Ulysses | ring / reference | ring / ring at N={min(settings.devices)} |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = {row["length"]: row["temp"]["ring"] for row in memory if row["devices"] == min(settings.devices)}
    for row in memory:
        temp = row["temp"]
        cells = " | ".join(mib_text(temp[s]) for s in KERNELS)
        lines.append(
            f"| {row['length']:,} | {row['devices']} | {cells} | {temp['ring'] / temp['reference']:.4f} | "
            f"{temp['ring'] / base[row['length']]:.3f} |"
        )
    lines += [
        "",
        (
            f"Time, forward + backward, median of {settings.repeats}: wall seconds, ratio to the GSPMD reference "
            "(to all-gather where the reference was not run), CPU-time ratio in brackets:"
        ),
        "",
        "| T | H | N | " + " | ".join(LABELS[s] for s in KERNELS) + " |",
        "| ---: | ---: | ---: |" + " ---: |" * len(KERNELS),
    ]
    for row in timings:
        cells = " | ".join(_time_cell(row, s) for s in KERNELS)
        lines.append(f"| {row['length']:,} | {row['heads']} | {row['devices']} | {cells} |")
    lines += ["", "Goals:", ""] + [f"- {g.status}: {g.name}: {g.detail}" for g in goals]
    return "\n".join(lines)


def _time_cell(row, kernel):
    wall, cpu = row["wall"], row["cpu"]
    if kernel not in wall:
        return "not run" if kernel in row["skipped"] else "-"
    base = "reference" if "reference" in wall else "gather"
    return f"{_seconds(wall[kernel])}, {wall[kernel] / wall[base]:.2f} x ({cpu[kernel] / cpu[base]:.2f} x)"
