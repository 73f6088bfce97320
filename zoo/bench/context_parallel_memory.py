"""``zoo bench context``: per-device memory of a GPT training step, data- vs context-parallel.

One training step (forward, backward, SGD update: ``comms_report.train_step``, the
maths of ``model.fit``'s step) of a GPT-like causal LM built from ``TransformerBlock``
(token embedding -> L blocks, causal, rotary -> LayerNorm -> Dense over the
vocabulary, per-token cross-entropy) is compiled, never run, under each layout:

- **data-parallel** (``keras.distribution.DataParallel``, mesh ``data=N``): the batch
  is split, every device holds whole sequences, attention runs on whole arrays (the
  zoo's reference attention: f32[B/N, H, T, T] scores).
- **context-parallel** (``zoo.distribution.ContextParallel``, mesh ``data=Nd,seq=Ns``):
  batch and sequence are split, attention runs the ``ring`` kernel (O(T/Ns) memory),
  the rest is GSPMD on (B/Nd, T/Ns, C) activations.

``compiled.memory_analysis()`` gives each device's temporary bytes (activations kept
for the backward pass, scores, workspace), argument bytes (weights, optimizer state,
the batch) and output bytes; deterministic, the same on every run. The collectives of
the compiled step (``comms_report``) give what each device sends; the ring's hops sit
in ``while`` loops, so each collective is counted as often as XLA's known trip counts
of the loops around it say (``CollectiveOp.executions``), not once per instruction.

Each run is ``"<mesh>:<global batch>"``. The default rows hold T = 16,384 on 8
devices: data=8 with B = 8 (one whole sequence per device, the least data
parallelism can do), data=1,seq=8 with B = 1 (1/8 of a sequence per device),
data=2,seq=4 with B = 2 (1/4), and data=1,seq=8 with B = 8 (data parallelism's
global batch, the same tokens per device).

Goal (issue 6): at one sequence's worth of tokens split N ways, per-device temporary
memory falls at least N-fold from data parallelism's one sequence per device.
"""

import collections
import dataclasses

import jax
import keras
import numpy as np

from zoo.bench._output import mib_text, publish
from zoo.config.bench_settings import ContextBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.choices import CONTEXT_ATTENTIONS
from zoo.distribution import describe_devices, make_mesh, parse_mesh_spec
from zoo.distribution.axes import DATA, SEQ
from zoo.distribution.context_parallel import ContextParallel
from zoo.layers import TransformerBlock
from zoo.measure.comms_report import FAST_COMPILE, comms_report, train_step
from zoo.units import GIB


@dataclasses.dataclass
class Run:
    """One layout: ``mesh`` spec and global batch, and what its compiled step needs per device."""

    mesh: str
    batch: int
    kind: str = ""  # "data-parallel" or "context-parallel"
    tokens_per_device: int = 0
    temp: int = 0  # bytes
    argument: int = 0
    output: int = 0
    sent: float = 0.0  # bytes each device sends per step, loop trip counts included
    collectives: dict = dataclasses.field(default_factory=dict)  # kind -> executions per step
    exact: bool = True  # False: some loop had no known trip count (counted once: a lower bound)


def run_benchmark(settings, report=print):
    """Compile every run's training step; report markdown (``settings``:
    ``zoo.config.bench_settings.ContextBenchSettings``; ``settings.plot``: also the chart). Returns ``{"runs": [Run], "goal": (status, text)}``."""
    check_settings(settings)
    runs = [parse_run(text, settings) for text in settings.runs]
    for run in runs:
        measure(run, settings)
        report(f"{run.mesh} B={run.batch} ({run.kind}): temp {_mib(run.temp)}, arguments {_mib(run.argument)}")
    goal = evaluate_goal(runs, settings)
    text = format_report(settings, runs, goal)
    publish(text, settings, report)
    if settings.plot:
        from zoo.plotting import plot_context_memory

        plot_context_memory(
            runs, settings.plot, title=f"GPT-like training step, T={settings.sequence_length:,}: per device, by layout"
        )
    return {"runs": runs, "goal": goal}


def check_settings(settings):
    for name in ("sequence_length", "layers", "width", "heads", "head_dim", "hidden_dim", "vocab"):
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if settings.context_attention not in CONTEXT_ATTENTIONS:
        raise ValueError(
            f"context_attention must be one of {', '.join(CONTEXT_ATTENTIONS)}, got {settings.context_attention!r}"
        )
    if not settings.runs:
        raise ValueError("runs must name at least one '<mesh>:<global batch>' layout")


def parse_run(text, settings):
    """``"data=2,seq=4:2"`` -> ``Run``, checking the sizes against the devices and T."""
    mesh, sep, batch = text.rpartition(":")
    if not sep or not batch.strip().isdigit() or int(batch) < 1:
        raise ValueError(f"run {text!r} must be '<mesh>:<global batch>', e.g. 'data=2,seq=4:2'")
    axes = dict(parse_mesh_spec(mesh))
    unknown = sorted(set(axes) - {DATA, SEQ})
    if unknown or DATA not in axes:
        raise ValueError(f"run {text!r}: the mesh needs a 'data' axis and may have 'seq', got axes {list(axes)}")
    run = Run(mesh, int(batch), "context-parallel" if SEQ in axes else "data-parallel")
    data, seq = axes[DATA], axes.get(SEQ, 1)
    if run.batch % data:
        raise ValueError(f"run {text!r}: batch {run.batch} is not divisible by the 'data' axis of size {data}")
    multiple = 2 * seq if settings.balance == "zigzag" and SEQ in axes else seq
    if settings.sequence_length % multiple:
        raise ValueError(f"run {text!r}: sequence length {settings.sequence_length} is not divisible by {multiple}")
    if data * seq > len(jax.devices()):
        raise ValueError(
            f"run {text!r} needs {data * seq} devices but JAX has {len(jax.devices())}; run with --simulate-devices {data * seq}"
        )
    run.tokens_per_device = run.batch // data * settings.sequence_length // seq
    return run


def build_model(settings):
    """The GPT-like causal LM: (B, T) token ids -> (B, T, V) logits."""
    tokens = keras.Input((settings.sequence_length,), dtype="int32", name="tokens")  # (B, T)
    x = keras.layers.Embedding(settings.vocab, settings.width, name="token_embedding")(tokens)  # (B, T, C)
    for index in range(settings.layers):
        x = TransformerBlock(
            num_heads=settings.heads,
            head_dim=settings.head_dim,
            hidden_dim=settings.hidden_dim,
            causal=True,
            rotary=True,
            name=f"block_{index}",
        )(x)  # (B, T, C)
    x = keras.layers.LayerNormalization(name="final_norm")(x)  # (B, T, C)
    logits = keras.layers.Dense(settings.vocab, name="lm_head")(x)  # (B, T, V)
    model = keras.Model(tokens, logits, name="gpt_like")
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def run_distribution(run, settings):
    """DataParallel or ContextParallel on the run's mesh."""
    mesh = make_mesh(run.mesh, devices=jax.devices()[: _device_count(run.mesh)])
    if run.kind == "data-parallel":
        return keras.distribution.DataParallel(device_mesh=mesh)
    return ContextParallel(mesh, context_attention=settings.context_attention, balance=settings.balance)


def measure(run, settings):
    """Fill ``run``'s memory and communication from its compiled training step."""
    distribution = run_distribution(run, settings)
    keras.backend.clear_session()
    keras.distribution.set_distribution(distribution)
    try:
        keras.utils.set_random_seed(0)
        model = build_model(settings)
        tokens = np.random.default_rng(0).integers(
            0, settings.vocab, size=(run.batch, settings.sequence_length), dtype=np.int32
        )
        step, args = train_step(model, tokens, np.roll(tokens, -1, axis=1))
        report = comms_report(step, *args, mesh=distribution.device_mesh, compiler_options=FAST_COMPILE)
    finally:
        keras.distribution.set_distribution(None)
    memory = report.memory
    run.temp, run.argument, run.output = memory.temp_bytes, memory.argument_bytes, memory.output_bytes
    run.sent, run.exact = report.sent_bytes(), report.exact
    counts = collections.Counter()
    for op in report.collectives:
        counts[op.kind] += op.executions
    run.collectives = dict(counts)
    return run


def evaluate_goal(runs, settings):
    """PASS if every context-parallel run holding 1/N of a sequence per device (N >= 2)
    needs <= 1/N of the temporary memory of the data-parallel run holding one sequence."""
    base = next(
        (r for r in runs if r.kind == "data-parallel" and r.tokens_per_device == settings.sequence_length), None
    )
    split = [r for r in runs if r.kind == "context-parallel" and r.tokens_per_device < settings.sequence_length]
    if base is None or not split:
        return (
            "NOT MEASURED",
            "needs a data-parallel run with one sequence per device and a context-parallel run with less",
        )
    details, ok = [], True
    for run in split:
        n = settings.sequence_length // run.tokens_per_device
        ratio = run.temp / base.temp
        ok &= ratio <= 1 / n
        details.append(f"{run.mesh} B={run.batch}: {ratio:.4f} x (1/{n} = {1 / n:.4f})")
    return ("PASS" if ok else "MISS"), "; ".join(details)


def format_report(settings, runs, goal):
    base = next((r for r in runs if r.kind == "data-parallel"), runs[0])
    lines = [
        (
            f"devices: {describe_devices()}; GPT-like LM: L={settings.layers} blocks, C={settings.width}, H=K={settings.heads}, "
            f"D={settings.head_dim}, F={settings.hidden_dim}, V={settings.vocab}, T={settings.sequence_length:,}, float32, causal + rotary; "
            f"one training step (forward + backward + SGD), compiled, not run; context-parallel attention "
            f"{settings.context_attention}, balance {settings.balance}; jax {jax.__version__}, keras {keras.__version__}"
        ),
        "",
        "Per device (compiled memory analysis; sends and collectives executed per step, from the compiled step):",
        "",
        "| layout | mesh | global batch | tokens / device | temporary | temp / data-parallel | arguments | sends / step | collectives |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        collectives = ", ".join(f"{count} {kind}" for kind, count in sorted(run.collectives.items())) or "none"
        lines.append(
            f"| {run.kind} | {run.mesh} | {run.batch} | {run.tokens_per_device:,} | {_mib(run.temp)} | "
            f"{run.temp / base.temp:.4f} | {_mib(run.argument)} | {'' if run.exact else '>= '}{_mib(run.sent)} | {collectives} |"
        )
    lines += [
        "",
        f"Goal: {goal[0]}: per-device temporary memory <= 1/N of data-parallel's at 1/N of a sequence per device: {goal[1]}",
    ]
    return "\n".join(lines)


def _device_count(mesh):
    return int(np.prod([size for _, size in parse_mesh_spec(mesh)]))


def _mib(nbytes):
    """Bytes as MiB (KiB below 1 MiB, GiB from 10 GiB)."""
    return mib_text(nbytes, gib_from=10 * GIB)
