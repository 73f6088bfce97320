"""``zoo bench lm-head``: under FSDP, what the LM head gathers (its weight or the global
batch's activations) and what each choice costs, compile-only.

The model is ``GPTCausalLM`` with Llama-3.2-1B's sizes (``Llama32Sizes``; few blocks by
default: the head's collectives do not depend on depth), tied or untied, under the
``fsdp`` layout on a ``data`` axis of N simulated devices, ``b`` sequences of T tokens
per device (global batch B = N b). For each (N, b, head) the ``fit`` step is compiled
(never run) three times: with the head's own choice (``GPTCausalLM.lm_head_gather``) and
with each choice forced on the model (``table``, ``activations``). Each row reports the
bytes one device sends over ``data`` per step (every collective of the compiled HLO,
loop trip counts included, by ``zoo.measure.comms_report``) and the peak memory
(``memory_analysis``); the goal: the chosen program sends no more than the cheaper
forced one. A forced choice is the model's ``lm_head_gather`` replaced on that one
instance (the same ``LMHeadGather`` with another ``choice``).
"""

import dataclasses
import time

import jax
import keras

from zoo.bench._output import publish, size_text
from zoo.config.bench_settings import LMHeadBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution import make_mesh
from zoo.distribution.axes import DATA
from zoo.layers.lm_head_gather import ACTIVATIONS, TABLE
from zoo.measure.comms_report import FAST_COMPILE, compiled_report
from zoo.measure.compiled_step import abstract_build, compile_fit_step
from zoo.models import GPTCausalLM
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt.gpt_backbone import GPTBackbone

CHOICES = ("chosen", TABLE, ACTIVATIONS)  # the head's own choice, then each forced
SIZES = ("vocabulary_size", "num_layers", "hidden_dim", "num_query_heads", "num_key_value_heads", "head_dim")


@dataclasses.dataclass
class Row:
    """One (N, b, head): what the head chose and, per program, bytes sent over data and peak."""

    devices: int
    per_device_batch: int
    head: str  # "tied" or "untied"
    choice: str = ""  # what GPTCausalLM.lm_head_gather chose
    description: str = ""  # LMHeadGather.describe()
    sent: dict = dataclasses.field(default_factory=dict)  # program -> bytes one device sends over data per step
    peak: dict = dataclasses.field(default_factory=dict)  # program -> peak bytes per device
    compile_s: float = 0.0

    @property
    def cheapest(self):
        """The forced choice that sends fewer bytes (the table on a tie)."""
        return min((TABLE, ACTIVATIONS), key=lambda name: self.sent[name])

    @property
    def meets_goal(self):
        return self.sent["chosen"] <= self.sent[self.cheapest]


def run_benchmark(settings, report=print):
    """Compile every row's three programs; report the markdown table (also to
    ``settings.output``). Returns ``{"rows": [Row]}``."""
    check_settings(settings)
    rows = []
    for devices in settings.devices:
        for per_device_batch in settings.per_device_batches:
            for head in settings.heads:
                row = measure(settings, devices, per_device_batch, head)
                report(format_row(row))
                rows.append(row)
    text = format_report(settings, rows)
    publish(text, settings, report)
    return {"rows": rows}


def check_settings(settings):
    """Refuse, before compiling anything, more devices than JAX has."""
    if max(settings.devices) > len(jax.devices()):
        raise ValueError(
            f"{max(settings.devices)} devices asked for but JAX has {len(jax.devices())}; "
            f"run with --simulate-devices {max(settings.devices)}"
        )


def model_arguments(settings, head):
    """``GPTBackbone`` arguments: the configured sizes, SwiGLU, RMSNorm, the head tied or not."""
    sizes = {name: getattr(settings, name) for name in SIZES}
    return dict(
        sizes,
        intermediate_dim=settings.intermediate_dim,
        mlp="swiglu",
        norm="rms",
        max_sequence_length=settings.sequence_length,
        tie_word_embeddings=head == "tied",
    )


def compile_model(model):
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )


def measure(settings, devices, per_device_batch, head):
    """One ``Row``: the fsdp step compiled with the head's choice and with each forced."""
    row = Row(devices, per_device_batch, head)
    arguments = model_arguments(settings, head)
    mesh = make_mesh(f"{DATA}={devices}", devices=jax.devices()[:devices])
    layout_map = GPTCausalLM.get_layout_map(mesh, "fsdp", config=arguments)
    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name=DATA)
    batch = devices * per_device_batch
    start = time.perf_counter()
    with dtype_policy_scope(settings.precision):
        for program in CHOICES:
            row.sent[program], row.peak[program], chosen = compile_program(
                arguments, distribution, batch, settings.sequence_length, program
            )
            if program == "chosen":
                row.choice, row.description = chosen.choice, chosen.describe()
    row.compile_s = time.perf_counter() - start
    return row


def compile_program(arguments, distribution, batch, length, program):
    """``(bytes sent over data per step, peak bytes, the head's own LMHeadGather)`` of the
    fit step with the head's choice (``program`` "chosen") or with ``program`` forced."""
    keras.backend.clear_session()
    model = abstract_build(lambda: GPTCausalLM(backbone=GPTBackbone(**arguments)), compile_model, distribution)
    chosen = _chosen(model, distribution, batch, length)
    if program != "chosen":
        forced = dataclasses.replace(chosen, choice=program)
        model.lm_head_gather = lambda batch_size, sequence_length: forced  # this instance only
    tokens = ((batch, length), "int32")  # next-token targets: the same shape
    compiled, memory = compile_fit_step(model, distribution, tokens, tokens, compiler_options=FAST_COMPILE)
    return compiled_report(compiled, distribution.device_mesh).sent_bytes(None, DATA), memory.peak, chosen


def _chosen(model, distribution, batch, length):
    """``model.lm_head_gather`` for one global batch, under ``distribution``."""
    keras.distribution.set_distribution(distribution)
    try:
        return model.lm_head_gather(batch, length)
    finally:
        keras.distribution.set_distribution(None)


# --- the report ---------------------------------------------------------------------------


def format_row(row):
    sent = " | ".join(size_text(row.sent[name]) for name in CHOICES)
    peak = " | ".join(size_text(row.peak[name]) for name in CHOICES)
    goal = "yes" if row.meets_goal else "**no**"
    return (
        f"| {row.devices} | {row.per_device_batch} | {row.head} | {row.choice} | {sent} | {peak} | {goal} | "
        f"{row.compile_s:.0f} |"
    )


def format_report(settings, rows):
    sizes = ", ".join(f"{name}={getattr(settings, name):,}" for name in SIZES)
    lines = [
        (
            f"{jax.devices()[0].platform} devices (simulated), compiled, not run; GPTCausalLM {sizes}, "
            f"F={settings.intermediate_dim:,}, SwiGLU, RMSNorm, T={settings.sequence_length:,}, {settings.precision}, "
            "AdamW; layout fsdp on data=N; bytes one device sends over data per step (every collective, loop trip "
            "counts included) and peak memory per device, with the head's choice and with each choice forced."
        ),
        "",
        "| N | b per device | head | chosen | sent: chosen | sent: table | sent: activations | peak: chosen | "
        "peak: table | peak: activations | chosen <= cheaper | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + [format_row(row) for row in rows])
