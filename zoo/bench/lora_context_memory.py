"""``zoo bench lora-context``: per-device memory of LoRA fine-tuning a Llama-3.2-1B-sized
GPT at long context, ``context`` vs ``fsdp``, compiled, never run.

The model is ``GPTCausalLM`` with gpt_1b's shape (RMSNorm, SwiGLU, GQA, rotary) and
Llama-3.2-1B's sizes (the named config ``llama_3_2_1b``: its Hugging Face config.json: V = 128,256,
C = 2048, L = 16, H = 32, K = 8, D = 64, F = 8192, tied embeddings, RoPE base 500,000
with Llama 3 scaling). LoRA of rank r on every Dense / EinsumDense
(``zoo.training.finetune.enable_lora``); every other weight frozen, so only the factors
have gradients and AdamW slots. The optimizer is the GPT job's (``compile_gpt``: AdamW,
cosine schedule, global-norm clipping).

Each row is built and compiled as ``zoo plan`` does it (``compiled_step.abstract_build``:
no weight allocated; ``compiled_step.compile_fit_step``: Keras' own ``train_step``, the
function ``fit`` jits, state donated, batch laid out by the distribution) for N
simulated devices under one layout:

- ``context``: ``ContextParallel`` on ``data=1,seq=N``, global batch 1 (T/N tokens per
  device), the ``context_attention`` kernel (ring) with ``balance`` (zigzag), weights
  split over ``seq``;
- ``fsdp``: ``ModelParallel`` with the GPT's fsdp layout map on ``data=N``, global
  batch N (one whole sequence per device), plain attention (the blockwise kernel).

Per device: ``memory_analysis()``'s temporaries, arguments, outputs and aliased
(donated) bytes; total = arguments + outputs - aliased + temporaries
(``StepMemory.peak``). Collectives from the compiled HLO (``comms_report``), each
counted as often as the loops around it run.

LoRA factors in an abstract build: ``enable_lora`` lays each factor out like its kernel
there too (the kernel's layout under the distribution, the factor's own layout set while
it is deferred), so under ``fsdp`` the factors are compiled split over ``data`` as ``fit``
splits them (tests/bench/test_lora_context_memory.py checks the compiled gradients' bytes
against the split a concrete build gives). The update is computed factored
(``x @ kernel + (alpha / r) (x @ a) @ b``), so no frozen kernel's (C, F) gradient is formed.
"""

import collections
import dataclasses
import time

import jax
import keras

from zoo import distribution as zd
from zoo.bench._gpt import LLAMA_3_2_1B, SIZES, compile_model
from zoo.bench._output import publish, remat_warning, size_text
from zoo.config.bench_settings import LoraContextBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution.axes import DATA, SEQ
from zoo.measure.comms_report import FAST_COMPILE, compiled_report
from zoo.measure.compiled_step import abstract_build, compile_fit_step
from zoo.measure.hardware import device_spec
from zoo.models import GPTCausalLM
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt.gpt_backbone import GPTBackbone
from zoo.training.finetune import enable_lora, is_lora_variable

TARGETS = ("h100", "h200")  # the "fits" columns: zoo.measure.hardware.DEVICES kinds (80 and 141 GiB)


def layout_mesh(layout, devices):
    """``(mesh spec, global batch)`` of a layout: the smallest batch it can hold on ``devices``."""
    if layout == "context":
        return f"{DATA}=1,{SEQ}={devices}", 1
    if layout == "fsdp":
        return f"{DATA}={devices}", devices
    raise ValueError(f"layout {layout!r} is not measured here; choose context or fsdp")


@dataclasses.dataclass
class Row:
    """One compiled step: its layout, sizes and what it needs per device (bytes)."""

    layout: str
    mesh: str
    sequence_length: int
    batch: int
    remat: str
    tokens_per_device: int = 0
    memory: object = None  # compiled_step.StepMemory
    collectives: dict = dataclasses.field(default_factory=dict)  # kind -> executions per step
    sent: float = 0.0  # bytes each device sends per step, loop trip counts included
    exact: bool = True  # False: some loop had no known trip count (counts are lower bounds)
    compile_s: float = 0.0  # seconds to build and compile
    compiled: object = dataclasses.field(default=None, repr=False)

    @property
    def total(self):
        return self.memory.peak


def run_benchmark(settings, report=print):
    """Compile every (remat, T, layout) row; report the markdown table (also to
    ``settings.output``). Returns ``{"rows": [Row]}``."""
    check_settings(settings)
    rows = []
    for remat in settings.remats:
        for length in settings.sequence_lengths:
            for layout in settings.layouts:
                row = measure(settings, layout, length, remat)
                report(
                    f"{layout} {row.mesh} T={length:,} B={row.batch} remat={remat}: total {size_text(row.total)} "
                    f"(temp {size_text(row.memory.temp)}), compiled in {row.compile_s:.0f} s"
                )
                rows.append(row)
    text = format_report(settings, rows)
    publish(text, settings, report)
    return {"rows": rows}


def check_settings(settings):
    """Refuse, before compiling anything, sizes the devices or the layouts cannot take."""
    if settings.devices > len(jax.devices()):
        raise ValueError(
            f"{settings.devices} devices asked for but JAX has {len(jax.devices())}; run with --simulate-devices {settings.devices}"
        )
    if not settings.layouts or not settings.remats or not settings.sequence_lengths:
        raise ValueError("layouts, remats and sequence_lengths must each name at least one value")
    for layout in settings.layouts:
        layout_mesh(layout, settings.devices)
    multiple = 2 * settings.devices if settings.balance == "zigzag" else settings.devices
    if (
        settings.loss_chunk_size is not None
        and "context" in settings.layouts
        and settings.loss_chunk_size % settings.devices
    ):
        raise ValueError(
            f"loss_chunk_size {settings.loss_chunk_size} is not divisible by the seq axis of size {settings.devices} (each chunk split like the sequence)"
        )
    for length in settings.sequence_lengths:
        if "context" in settings.layouts and length % multiple:
            raise ValueError(
                f"sequence length {length} is not divisible by {multiple} (the seq axis of size {settings.devices}, balance {settings.balance})"
            )


def model_config(settings, remat):
    """The ``GPTBackbone`` arguments of one row."""
    longest = max(LLAMA_3_2_1B["max_sequence_length"], *settings.sequence_lengths)
    return {
        **LLAMA_3_2_1B,
        **{name: getattr(settings, name) for name in SIZES},
        "max_sequence_length": longest,
        "remat": remat,
    }


def row_distribution(settings, layout, mesh, arguments):
    context = (
        {"context_attention": settings.context_attention, "balance": settings.balance} if layout == "context" else {}
    )
    devices = jax.devices()[: settings.devices]
    return zd.distribution_for(GPTCausalLM, layout, zd.make_mesh(mesh, devices=devices), config=arguments, **context)


def build_lora_model(arguments, settings):
    """``GPTCausalLM`` of ``arguments`` under the precision policy, LoRA on every Dense /
    EinsumDense, only the factors trainable; call under the row's distribution."""
    with dtype_policy_scope(settings.precision):
        model = GPTCausalLM(backbone=GPTBackbone(**arguments), loss_chunk_size=settings.loss_chunk_size)
    enable_lora(model, settings.lora_rank)  # factors laid out like their kernels, abstract build too
    for variable in model.weights:
        variable.trainable = is_lora_variable(variable)
    return model


def measure(settings, layout, length, remat):
    """One ``Row``: the LoRA fine-tuning step compiled for ``layout`` at T = ``length``."""
    mesh, batch = layout_mesh(layout, settings.devices)
    row = Row(layout, mesh, length, batch, remat)
    row.tokens_per_device = length if layout == "fsdp" else length // settings.devices
    start = time.perf_counter()
    arguments = model_config(settings, remat)
    distribution = row_distribution(settings, layout, mesh, arguments)
    keras.backend.clear_session()
    model = abstract_build(lambda: build_lora_model(arguments, settings), compile_model, distribution)
    tokens = ((batch, length), "int32")  # next-token targets: the same shape
    row.compiled, row.memory = compile_fit_step(model, distribution, tokens, tokens, compiler_options=FAST_COMPILE)
    comms = compiled_report(row.compiled, distribution.device_mesh)
    row.compile_s = time.perf_counter() - start
    counts = collections.Counter()
    for op in comms.collectives:
        counts[op.kind] += op.executions
    row.collectives, row.sent, row.exact = dict(counts), comms.sent_bytes(), comms.exact
    return row


# --- the report ---------------------------------------------------------------------------


def _fits(total):
    return " / ".join("yes" if total <= device_spec(name).memory_bytes else "no" for name in TARGETS)


def format_row(row):
    m = row.memory
    collectives = ", ".join(f"{count:,} {kind}" for kind, count in sorted(row.collectives.items())) or "none"
    sent = f"{'' if row.exact else '>= '}{size_text(row.sent)}"
    return (
        f"| {row.layout} | {row.mesh} | {row.remat} | {row.sequence_length:,} | {row.batch} | {row.tokens_per_device:,} | "
        f"{size_text(m.temp)} | {size_text(m.argument)} | {size_text(m.gradients + m.optimizer)} | **{size_text(row.total)}** | {_fits(row.total)} | "
        f"{sent} | {collectives} | {row.compile_s:.0f} |"
    )


def format_report(settings, rows):
    sizes = ", ".join(f"{name}={getattr(settings, name):,}" for name in SIZES)
    remat_note = remat_warning(settings.remats)
    lines = [
        (
            f"devices: {settings.devices} x {jax.devices()[0].platform} (simulated), compiled, not run; GPTCausalLM {sizes}, tied embeddings, "
            f"RoPE 500,000 + llama3 scaling; LoRA r={settings.lora_rank} on every Dense/EinsumDense, all else frozen; AdamW; "
            f"{settings.precision}; context: {settings.context_attention} attention, balance {settings.balance}; "
            f"loss {'from the whole logits' if settings.loss_chunk_size is None else f'in chunks of {settings.loss_chunk_size:,} positions'}; "
            f"jax {jax.__version__}, keras {keras.__version__}.{remat_note}"
        ),
        "",
        (
            "Per device (memory_analysis; total = arguments + outputs - donated + temporaries; LoRA state = its gradients + AdamW slots, "
            "inside temp and arguments; fits = total <= 80 GiB H100 / 141 GiB H200; sent and collectives per step, loop trips included):"
        ),
        "",
        "| layout | mesh | remat | T | global batch | tokens / device | temp | arguments | LoRA state | total | fits H100 / H200 | sent | collectives | compile (s) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    return "\n".join(lines + [format_row(row) for row in rows])
