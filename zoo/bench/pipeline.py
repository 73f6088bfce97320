"""``zoo bench pipeline``: the pipeline's bubble, measured through its own loop, and the
compiled per-device memory of a pipelined Llama-3.2-1B-sized GPT (compile-only).

Bubble (section ``bubble``): ``zoo.kernels.pipeline.pipeline`` runs under
``jax.shard_map`` over a ``stage`` mesh axis of S simulated devices, on M
micro-batches of a tiny array with a cheap ``stage_fn`` (``x * w + 1``: what is
measured is the schedule, not the blocks), for GPipe (R = 1) and the circular
schedule (R >= 2). Each stage returns ``useful``, the ticks at which it did work,
counted by the kernel's loop; the row reports it with the loop's R*M + S - 1 ticks,
the measured fraction useful / ticks and the formula R*M / (R*M + S - 1). A
measurement that differs from the formula is an error (``BubbleMismatch``), not a row.
The bubble in units of a GPipe stage-step: each stage idles S - 1 ticks of 1/R of a
GPipe stage's blocks, (S - 1) / R.

Memory (section ``memory``): the exact ``fit`` step (Keras' ``train_step``, state
donated) of ``GPTCausalLM`` with gpt_1b's shape and Llama-3.2-1B's sizes
(the named config ``llama_3_2_1b`` with ``Llama32Sizes``), all weights trained with
AdamW (``compile_gpt``), built abstractly (``compiled_step.abstract_build``: nothing
allocated) and compiled (``compiled_step.compile_fit_step``) on the simulated devices:

- layout ``pipeline`` on ``mesh`` (default ``data=2,stage=4``) for each M of
  ``memory_micro_batches`` and each R of ``memory_repeats`` (1: GPipe, >= 2: circular);
- the same model unpipelined (blocks ``block_<i>``, layout ``data`` on ``data=N``):
  every weight on every device, the reference of the weights column.

Per device (``memory_analysis()``): arguments (weights + AdamW slots + the batch),
temporaries (activations kept for the backward pass, gradients, workspace); the
weights split by the variables' shardings into the blocks' and the rest (token
embedding, final norm: not split by stage). Collective-permutes over ``stage`` and
all-reduces over ``data`` (the weights' gradients) from the compiled HLO
(``comms_report``), each counted as often as its loop runs.
"""

import collections
import dataclasses
import time

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import PartitionSpec as P

from zoo import distribution as zd
from zoo.bench._gpt import LLAMA_3_2_1B, SIZES, build_model, compile_model
from zoo.bench._output import publish, remat_warning, size_text
from zoo.config.bench_settings import PIPELINE_SECTIONS, PipelineBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.layouts import PIPELINE
from zoo.distribution.axes import DATA, STAGE
from zoo.kernels.pipeline import check_schedule, num_ticks, pipeline
from zoo.layers import run_on_mesh
from zoo.measure.comms_report import FAST_COMPILE, compiled_report
from zoo.measure.compiled_step import (
    abstract_build,
    compile_fit_step,
    shard_bytes,
    state_shardings,
)
from zoo.models import GPTCausalLM

WIDTH = 8  # the bubble's micro-batches: [M, 1, WIDTH] float32


class BubbleMismatch(AssertionError):
    """The kernel's counted useful ticks differ from the schedule's formula."""


def schedule_name(repeats):
    return "gpipe" if repeats == 1 else "circular"


# --- the bubble -----------------------------------------------------------------------


@dataclasses.dataclass
class BubbleRow:
    """One schedule on S stages and M micro-batches: ticks, and useful ticks per stage (measured)."""

    stages: int
    repeats: int
    micro_batches: int
    useful: tuple  # ticks each stage did work, as the kernel counted them

    @property
    def schedule(self):
        return schedule_name(self.repeats)

    @property
    def ticks(self):
        return num_ticks(num_stages=self.stages, micro_batches=self.micro_batches, repeats=self.repeats)

    @property
    def measured(self):
        """useful / ticks, the same on every stage (checked)."""
        return self.useful[0] / self.ticks

    @property
    def formula(self):
        work = self.repeats * self.micro_batches
        return work / (work + self.stages - 1)

    @property
    def bubble_steps(self):
        """Idle time per stage in GPipe stage-steps (a stage-step of R = 1: all L/S blocks): (S - 1) / R."""
        return (self.stages - 1) / self.repeats


def _cheap_stage(group_params, x_m, extras_m, group):
    """``stage_fn`` of the bubble run: one cheap "block" per group."""
    return x_m * group_params[0] + 1.0


def _bubble_body(weights, x, *, repeats):
    """The ``shard_map`` body of ``measure_bubble``: (outputs, i32[1] this stage's useful ticks)."""
    y, useful = pipeline(_cheap_stage, weights, x, axis_name=STAGE, repeats=repeats)
    return y, useful[None]


def measure_bubble(stages, repeats, micro_batches, devices=None):
    """``BubbleRow`` of the kernel run on a ``stage`` mesh of ``stages`` devices; raises
    ``BubbleMismatch`` unless every stage worked R*M of the R*M + S - 1 ticks."""
    check_schedule(num_stages=stages, micro_batches=micro_batches, repeats=repeats)
    devices = jax.devices()[:stages] if devices is None else devices
    mesh = jax.sharding.Mesh(np.asarray(devices), (STAGE,))
    weights = jnp.full((repeats, stages, WIDTH), 0.5, jnp.float32)  # [R, S groups of 1 "block", ...]
    x = jnp.ones((micro_batches, 1, WIDTH), jnp.float32)  # [M, b=1, WIDTH]

    y, useful = run_on_mesh(mesh, _bubble_body, (weights, x), (P(None, STAGE), P()), (P(), P(STAGE)), repeats=repeats)
    expected = x
    for _ in range(repeats * stages):  # the single-device reference: every group in order
        expected = expected * 0.5 + 1.0
    row = BubbleRow(stages, repeats, micro_batches, tuple(int(u) for u in np.asarray(useful)))
    if not np.allclose(np.asarray(y), np.asarray(expected)):
        raise BubbleMismatch(
            f"{row.schedule} S={stages} R={repeats} M={micro_batches}: outputs differ from the sequential reference"
        )
    if any(u != repeats * micro_batches for u in row.useful) or not np.isclose(row.measured, row.formula):
        raise BubbleMismatch(
            f"{row.schedule} S={stages} R={repeats} M={micro_batches}: useful ticks per stage {list(row.useful)} of {row.ticks} "
            f"(fraction {row.measured:.4f}) differ from the formula R*M/(R*M+S-1) = {repeats * micro_batches}/{row.ticks} = {row.formula:.4f}"
        )
    return row


def bubble_rows(settings, report=print):
    rows = []
    for repeats in settings.repeats:
        for micro_batches in settings.micro_batches:
            row = measure_bubble(settings.stages, repeats, micro_batches)
            report(
                f"bubble {row.schedule} S={row.stages} R={repeats} M={micro_batches}: useful {list(row.useful)} of {row.ticks} ticks"
            )
            rows.append(row)
    return rows


def format_bubble(settings, rows):
    lines = [
        (
            f"Bubble: zoo.kernels.pipeline under jax.shard_map on a stage axis of {settings.stages} {jax.devices()[0].platform} devices "
            "(simulated); useful = ticks each stage did work, counted by the kernel's loop (every stage the same; checked against "
            "the formula, an error otherwise); bubble = idle time per stage in GPipe stage-steps, (S-1)/R."
        ),
        "",
        "| schedule | S | R | M | ticks R*M+S-1 | useful ticks / stage (measured) | useful fraction (measured) | R*M/(R*M+S-1) | bubble (GPipe stage-steps) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row.schedule} | {row.stages} | {row.repeats} | {row.micro_batches} | {row.ticks} | {row.useful[0]} | "
            f"{row.measured:.4f} | {row.formula:.4f} | {row.bubble_steps:g} |"
        )
    return lines


# --- the memory -----------------------------------------------------------------------


@dataclasses.dataclass
class MemoryRow:
    """One compiled fit step: pipelined (``repeats`` set) or the unpipelined reference."""

    layout: str
    mesh: str
    remat: str
    repeats: int | None = None  # None: unpipelined
    micro_batches: int | None = None
    memory: object = None  # compiled_step.StepMemory
    block_weights: int = 0  # bytes per device of the blocks' weights
    other_weights: int = 0  # the rest: token embedding, final norm (not split by stage)
    model_weights: int = 0  # bytes of every weight of the model, unsplit
    model_block_weights: int = 0  # bytes of the blocks' weights, unsplit
    permutes: int = 0  # collective-permutes over stage per step (loop trips included)
    permute_bytes: float = 0.0  # bytes each device sends in them
    data_reduces: int = 0  # all-reduces over data per step (the weights' gradients; loop trips included)
    data_reduce_bytes: float = 0.0  # bytes each device sends in them
    collectives: dict = dataclasses.field(default_factory=dict)  # kind -> executions per step
    exact: bool = True  # False: some loop had no known trip count (counts are lower bounds)
    compile_s: float = 0.0
    compiled: object = dataclasses.field(default=None, repr=False)

    @property
    def schedule(self):
        return "none" if self.repeats is None else schedule_name(self.repeats)


def model_arguments(settings, remat, repeats=None, micro_batches=None):
    """``GPTBackbone`` arguments of a row: Llama-3.2-1B's, pipelined when ``repeats`` is set."""
    arguments = {**LLAMA_3_2_1B, **{name: getattr(settings, name) for name in SIZES}, "remat": remat}
    arguments["max_sequence_length"] = max(arguments["max_sequence_length"], settings.sequence_length)
    if repeats is not None:
        arguments |= {"schedule": schedule_name(repeats), "micro_batches": micro_batches, "repeats": repeats}
    return arguments


def measure_memory(settings, remat, repeats=None, micro_batches=None):
    """One ``MemoryRow``: the fit step compiled (never run) for the pipeline on
    ``settings.mesh`` (``repeats`` set) or unpipelined on ``settings.reference_mesh``."""
    pipelined = repeats is not None
    layout, mesh_spec = (PIPELINE, settings.mesh) if pipelined else ("data", settings.reference_mesh)
    row = MemoryRow(layout, mesh_spec, remat, repeats, micro_batches)
    start = time.perf_counter()
    arguments = model_arguments(settings, remat, repeats, micro_batches)
    mesh = zd.make_mesh(mesh_spec, devices=jax.devices()[: _mesh_devices(mesh_spec)])
    distribution = zd.distribution_for(GPTCausalLM, layout, mesh, **({"config": arguments} if pipelined else {}))
    keras.backend.clear_session()
    model = abstract_build(lambda: build_model(arguments, settings.precision), compile_model, distribution)
    tokens = ((settings.batch_size, settings.sequence_length), "int32")  # next-token targets: the same shape
    row.compiled, row.memory = compile_fit_step(model, distribution, tokens, tokens, compiler_options=FAST_COMPILE)
    trainable, non_trainable, _, _ = state_shardings(model, distribution)
    for variable, sharding in zip(model.trainable_variables + model.non_trainable_variables, trainable + non_trainable):
        nbytes = shard_bytes(variable, sharding)
        if _is_block_weight(variable.path):
            row.block_weights += nbytes
        else:
            row.other_weights += nbytes
        whole = int(np.prod(variable.shape)) * np.dtype(variable.dtype).itemsize
        row.model_weights += whole
        row.model_block_weights += whole if _is_block_weight(variable.path) else 0
    comms = compiled_report(row.compiled, distribution.device_mesh)
    counts = collections.Counter()
    for op in comms.collectives:
        counts[op.kind] += op.executions
    row.collectives, row.exact = dict(counts), comms.exact
    row.permutes = comms.count("collective-permute", STAGE) if pipelined else 0
    row.permute_bytes = comms.sent_bytes("collective-permute", STAGE) if pipelined else 0.0
    row.data_reduces = comms.count("all-reduce", DATA)
    row.data_reduce_bytes = comms.sent_bytes("all-reduce", DATA)
    row.compile_s = time.perf_counter() - start
    return row


def _is_block_weight(path):
    parts = path.split("/")
    return any(part == "blocks" or part.startswith("block_") for part in parts) and "seed_generator" not in path


def _mesh_devices(spec):
    return int(np.prod([size for _, size in zd.parse_mesh_spec(spec)]))


def memory_rows(settings, report=print):
    rows = []
    for remat in settings.remats:
        runs = [(None, None)] + [(r, m) for r in settings.memory_repeats for m in settings.memory_micro_batches]
        for repeats, micro_batches in runs:
            row = measure_memory(settings, remat, repeats, micro_batches)
            m = row.memory
            report(
                f"memory {row.schedule} R={repeats} M={micro_batches} {row.mesh} remat={remat}: arguments {size_text(m.argument)}, "
                f"temp {size_text(m.temp)}, {row.permutes} permutes, compiled in {row.compile_s:.0f} s"
            )
            rows.append(row)
    return rows


def _dash(value, text=str):
    return "-" if value is None else text(value)


def format_memory(settings, rows):
    sizes = ", ".join(f"{name}={getattr(settings, name):,}" for name in SIZES)
    remat_note = remat_warning(settings.remats)
    stages = dict(zd.parse_mesh_spec(settings.mesh)).get(STAGE, 1)
    lines = [
        (
            f"Memory: the fit step of GPTCausalLM ({sizes}; gpt_1b's shape, Llama-3.2-1B's sizes, tied embeddings), AdamW on every "
            f"weight, {settings.precision}, T={settings.sequence_length:,}, global batch {settings.batch_size}; compiled for "
            f"{jax.devices()[0].platform} devices (simulated), never run; jax {jax.__version__}, keras {keras.__version__}.{remat_note}"
        ),
        "",
        (
            f"Per device (memory_analysis): arguments = weights + AdamW slots + batch; temp = activations kept for the backward pass, "
            f"gradients, workspace; total = arguments + outputs - donated + temp. Weights split into the blocks' (split by stage: "
            f"x S = {stages} should give the model's) and the rest (embedding, final norm: on every stage). Permutes: "
            f"collective-permutes over stage per step, loop trips included (forward + backward: 2 (R*M+S-1)); all-reduces over data "
            f"(the weights' gradients) likewise; bytes = what one device sends."
        ),
        "",
        "| schedule | layout | mesh | remat | R | M | weights / device | of which blocks | blocks / device x S / model's blocks | arguments | temp | total | permutes (sent) | all-reduces over data (sent) | other collectives | compile (s) |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        m = row.memory
        ratio = f"{row.block_weights * (stages if row.repeats else 1) / row.model_block_weights:.3f}"
        counts = dict(row.collectives)
        counts.pop("collective-permute", None)
        counts["all-reduce"] = counts.get("all-reduce", 0) - row.data_reduces
        others = ", ".join(f"{count:,} {kind}" for kind, count in sorted(counts.items()) if count) or "none"
        bound = "" if row.exact else ">= "
        permutes = "-" if row.repeats is None else f"{bound}{row.permutes:,} ({size_text(row.permute_bytes)})"
        reduces = f"{bound}{row.data_reduces:,} ({size_text(row.data_reduce_bytes)})"
        lines.append(
            f"| {row.schedule} | {row.layout} | {row.mesh} | {row.remat} | {_dash(row.repeats)} | {_dash(row.micro_batches)} | "
            f"{size_text(m.weights)} | {size_text(row.block_weights)} | {ratio} | {size_text(m.argument)} | {size_text(m.temp)} | "
            f"**{size_text(m.peak)}** | {permutes} | {reduces} | {others} | {row.compile_s:.0f} |"
        )
    return lines


# --- the command ----------------------------------------------------------------------


def check_settings(settings):
    """Refuse, before running or compiling anything, numbers the schedule, the mesh or the model cannot take."""
    if not settings.sections or any(section not in PIPELINE_SECTIONS for section in settings.sections):
        raise ValueError(f"sections must name some of {list(PIPELINE_SECTIONS)}, got {settings.sections!r}")
    if "bubble" in settings.sections:
        if settings.stages > len(jax.devices()):
            raise ValueError(
                f"stages={settings.stages} needs {settings.stages} devices but JAX has {len(jax.devices())}; "
                f"run with --simulate-devices {settings.stages}"
            )
        for repeats in settings.repeats:
            for micro_batches in settings.micro_batches:
                check_schedule(num_stages=settings.stages, micro_batches=micro_batches, repeats=repeats)
    if "memory" in settings.sections:
        axes = dict(zd.parse_mesh_spec(settings.mesh))
        for spec in (settings.mesh, settings.reference_mesh):
            if any(size < 1 for _, size in zd.parse_mesh_spec(spec)):
                raise ValueError(f"mesh {spec!r}: give every axis its size (no -1 here)")
        if STAGE not in axes or set(axes) - {DATA, STAGE}:
            raise ValueError(
                f"mesh {settings.mesh!r}: the memory rows need a mesh of axes data and stage, such as 'data=2,stage=4'"
            )
        reference = dict(zd.parse_mesh_spec(settings.reference_mesh))
        if set(reference) != {DATA}:
            raise ValueError(
                f"reference_mesh {settings.reference_mesh!r}: the unpipelined reference runs layout data on a mesh 'data=N'"
            )
        needed = max(_mesh_devices(settings.mesh), _mesh_devices(settings.reference_mesh))
        if needed > len(jax.devices()):
            raise ValueError(
                f"the meshes need {needed} devices but JAX has {len(jax.devices())}; run with --simulate-devices {needed}"
            )
        stages, data = axes[STAGE], axes.get(DATA, 1)
        for batch_axis, size in ((settings.mesh, data), (settings.reference_mesh, reference[DATA])):
            if settings.batch_size % size:
                raise ValueError(
                    f"batch_size={settings.batch_size} does not divide over the data axis of {batch_axis!r} (size {size})"
                )
        for repeats in settings.memory_repeats:
            if settings.num_layers % (stages * repeats):
                raise ValueError(
                    f"num_layers={settings.num_layers} does not split into {repeats} repeat(s) x {stages} stages"
                )
            for micro_batches in settings.memory_micro_batches:
                check_schedule(num_stages=stages, micro_batches=micro_batches, repeats=repeats)
                if (settings.batch_size // data) % micro_batches:
                    raise ValueError(
                        f"micro_batches={micro_batches} does not divide the {settings.batch_size // data} rows per data shard "
                        f"(batch_size={settings.batch_size} over data={data})"
                    )


def run_benchmark(settings, report=print):
    """The bubble table and the memory table (``settings.sections``), printed as markdown
    (``report``) and written to ``settings.output``. Returns ``{"bubble": [BubbleRow], "memory": [MemoryRow]}``."""
    check_settings(settings)
    results, lines = {}, []
    if "bubble" in settings.sections:
        results["bubble"] = bubble_rows(settings, report)
        lines += format_bubble(settings, results["bubble"])
    if "memory" in settings.sections:
        results["memory"] = memory_rows(settings, report)
        lines += ([""] if lines else []) + format_memory(settings, results["memory"])
    text = "\n".join(lines)
    publish(text, settings, report)
    return results
