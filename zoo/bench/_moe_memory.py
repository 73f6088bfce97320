"""``zoo bench moe``'s memory section: a named MoE size at real size, built abstractly and
its fit step compiled for each run (``zoo.bench.moe``'s docstring)."""

import collections
import dataclasses
import time

import jax
import keras

from zoo import distribution as zd
from zoo.bench._gpt import build_model, compile_model
from zoo.bench._moe_common import (
    FLOAT_ITEMSIZES,
    batch_split,
    compute_dtype,
    exchange_totals,
    expert_split,
    expert_weight_gathers,
    mesh_devices,
)
from zoo.bench._moe_exchange import _factor, _moved, _parts
from zoo.bench._output import remat_warning, size_text
from zoo.distribution.axes import EXPERT
from zoo.kernels import moe
from zoo.measure.comms_report import FAST_COMPILE, compiled_report
from zoo.measure.compiled_step import abstract_build, compile_fit_step
from zoo.measure.hardware import device_spec, platform_of
from zoo.models import GPTCausalLM
from zoo.models.gpt.gpt_configs import config_by_name
from zoo.training.finetune import enable_lora, is_lora_variable
from zoo.units import GIB

# --- memory at real size --------------------------------------------------------------


@dataclasses.dataclass
class MemoryRow:
    """One fit step of the real-size MoE model, compiled for its mesh, never run."""

    method: str  # lora or full
    layout: str
    mesh: str
    capacity_factor: float | None
    num_layers: int
    model_layers: int  # the config's depth: fewer here is a partial build
    batch: int = 0
    memory: object = None  # compiled_step.StepMemory
    expert_bytes: int = 0
    model_expert_bytes: int = 0
    expert_parts: float | None = None
    token_exchanges: int = 0
    sent: float = 0.0  # bytes per device in all-to-alls over expert per step
    moved: str = ""  # the tokens' dtype in the compiled all-to-alls
    compute: str = ""
    per_exchange_minimum: float = 0.0  # at the dtype moved
    weight_gathers: int = 0
    collectives: dict = dataclasses.field(default_factory=dict)  # kind -> executions per step
    exact: bool = True
    compile_s: float = 0.0
    compiled: object = dataclasses.field(default=None, repr=False)

    @property
    def partial(self):
        return self.num_layers < self.model_layers

    @property
    def exchange_ratio(self):
        """Bytes per token all-to-all over the minimum of one exchange."""
        return self.sent / max(self.token_exchanges, 1) / self.per_exchange_minimum


def parse_run(run):
    method, layout, mesh = run.split(":", 2)
    return method, layout, mesh


def memory_arguments(settings, num_layers, capacity_factor):
    """``GPTBackbone`` arguments of a memory row: the named size at ``num_layers`` blocks."""
    arguments = config_by_name(settings.memory_config) | {
        "num_layers": num_layers,
        "capacity_factor": capacity_factor,
        "remat": settings.memory_remat,
        "dropout": 0.0,
    }
    arguments["max_sequence_length"] = max(arguments["max_sequence_length"], settings.memory_sequence_length)
    return arguments


def build_for_method(arguments, settings, method):
    """The row's model (call under its distribution): ``lora``: LoRA on every Dense /
    EinsumDense but the routers (``enable_lora`` skips them), only the factors trainable,
    laid out like their kernels; ``full``: as built."""
    model = build_model(arguments, settings.memory_precision)
    if method == "lora":
        enable_lora(model, settings.lora_rank)  # factors laid out like their kernels, abstract build too
        for variable in model.weights:
            variable.trainable = is_lora_variable(variable)
    return model


def measure_memory(settings, run, capacity_factor, num_layers):
    """One ``MemoryRow``: the fit step of ``run`` compiled at ``num_layers`` blocks."""
    method, layout, mesh_spec = parse_run(run)
    model_layers = config_by_name(settings.memory_config)["num_layers"]
    row = MemoryRow(method, layout, mesh_spec, capacity_factor, num_layers, model_layers, batch=batch_split(mesh_spec))
    start = time.perf_counter()
    arguments = memory_arguments(settings, num_layers, capacity_factor)
    mesh = zd.make_mesh(mesh_spec, devices=jax.devices()[: mesh_devices(mesh_spec)])
    distribution = zd.distribution_for(GPTCausalLM, layout, mesh, config=arguments)
    keras.backend.clear_session()
    tokens = ((row.batch, settings.memory_sequence_length), "int32")
    with moe.compile_for(platform_of(settings.memory_target)):  # the target's grouped matmul, not XLA:CPU's block loop
        model = abstract_build(lambda: build_for_method(arguments, settings, method), compile_model, distribution)
        row.compiled, row.memory = compile_fit_step(model, distribution, tokens, tokens, compiler_options=FAST_COMPILE)
    comms = compiled_report(row.compiled, distribution.device_mesh)
    row.compile_s = time.perf_counter() - start
    experts = zd.mesh_axis_size(distribution.device_mesh, EXPERT)
    tokens_per_device = settings.memory_sequence_length  # one sequence per device of data x expert
    row.token_exchanges, _, row.sent, row.moved = exchange_totals(comms)
    row.compute = compute_dtype(settings.memory_precision)
    row.per_exchange_minimum = moe.minimum_exchange_bytes(
        tokens_per_device,
        num_experts_per_token=arguments["num_experts_per_token"],
        width=arguments["hidden_dim"],
        itemsize=FLOAT_ITEMSIZES[row.moved],
        axis_size=experts,
    )
    row.expert_bytes, row.model_expert_bytes, row.expert_parts = expert_split(model, distribution)
    hidden = arguments.get("moe_intermediate_dim") or arguments["intermediate_dim"]
    row.weight_gathers = expert_weight_gathers(comms, arguments["hidden_dim"], hidden)
    counts = collections.Counter()
    for op in comms.collectives:
        counts[op.kind] += op.executions
    row.collectives, row.exact = dict(counts), comms.exact
    return row


def memory_rows(settings, report=print):
    rows = []
    depths = sorted(set(settings.memory_partial_layers)) + [config_by_name(settings.memory_config)["num_layers"]]
    for run in settings.memory_runs:
        for capacity_factor in settings.memory_capacity_factors:
            for num_layers in depths:
                row = measure_memory(settings, run, capacity_factor, num_layers)
                m = row.memory
                report(
                    f"memory {run} capacity {_factor(capacity_factor)} L={num_layers}: total {size_text(m.peak)} (temp "
                    f"{size_text(m.temp)}, arguments {size_text(m.argument)}), compiled in {row.compile_s:.0f} s"
                )
                rows.append(row)
    return rows


def format_memory(settings, rows):
    fits = device_spec(settings.memory_target)
    lines = [
        (
            f"Memory: {settings.memory_config} at real size, T={settings.memory_sequence_length:,}, one sequence per device of data x "
            f"expert, {settings.memory_precision}, remat {settings.memory_remat}, traced for {settings.memory_target} (experts' grouped "
            f"matmul {moe.grouped_matmul_implementation(platform_of(settings.memory_target))}); lora: rank {settings.lora_rank} on every "
            f"Dense/EinsumDense but the routers (attention, LM head), everything else frozen; full: every weight trained; AdamW; compiled for {jax.devices()[0].platform} devices "
            f"(simulated), never run; jax {jax.__version__}, keras {keras.__version__}.{remat_warning((settings.memory_remat,))}"
        ),
        "",
        (
            f"Per device (memory_analysis; total = arguments + outputs - donated + temporaries; fits = total <= "
            f"{fits.memory_bytes / GIB:.0f} GiB ({settings.memory_target}); expert weights from the shardings; all-to-alls over 'expert' "
            f"per step, bytes per exchange over the minimum N x k x C x itemsize x (E_p-1)/E_p at the dtype moved; remat re-runs "
            f"the forward's two):"
        ),
        "",
        (
            "| method | layout | mesh | capacity factor | blocks | global batch | weights | arguments | temp | total | fits | "
            "expert weights / device | of the experts | token all-to-alls | dtype moved | sent / exchange vs minimum | expert all-gathers | collectives | compile (s) | note |"
        ),
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | --- | ---: | ---: | --- | ---: | --- |",
    ]
    for row in rows:
        m = row.memory
        note = f"partial build: {row.num_layers} of {row.model_layers} blocks" if row.partial else "whole depth"
        collectives = ", ".join(f"{count:,} {kind}" for kind, count in sorted(row.collectives.items())) or "none"
        bound = "" if row.exact else ">= "
        lines.append(
            f"| {row.method} | {row.layout} | {row.mesh} | {_factor(row.capacity_factor)} | {row.num_layers} | {row.batch} | "
            f"{size_text(m.weights)} | {size_text(m.argument)} | {size_text(m.temp)} | **{size_text(m.peak)}** | "
            f"{'yes' if m.peak <= fits.memory_bytes else 'no'} | {size_text(row.expert_bytes)} | {_parts(row.expert_parts)} | "
            f"{bound}{row.token_exchanges} | {_moved(row.moved, row.compute)} | {row.exchange_ratio:.3f} | {row.weight_gathers} | {bound}{collectives} | {row.compile_s:.0f} | {note} |"
        )
    return lines
