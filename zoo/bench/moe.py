"""``zoo bench moe``: what the expert-parallel MoE moves, holds and costs, read from its own code path.

Exchange (section ``exchange``): a GPT whose every block is a Mixture-of-Experts block
(``MoEFeedForward``, E experts of width F, top k), built for real and compiled as
``fit`` compiles it (``compiled_step.compile_fit_step``: Keras' ``train_step``, state
donated) under layout ``expert`` on each mesh (``data=2,expert=4``, ``data=1,expert=8``)
and capacity factor (1.0, 1.25, dropless), remat none, FAST_COMPILE (the HLO passes
run; only LLVM's are skipped). From the compiled HLO (``comms_report``, loop trip
counts included): the all-to-alls over ``expert`` and the bytes each device sends in
them, against the analytic minimum ``4 x L x minimum_exchange_bytes`` (dispatch and
combine, forward and backward, per MoE block: N x k x C x itemsize x (E_p - 1) / E_p
each, N the tokens per device); the all-gathers of expert weights (any all-gather whose
buffer has an expert weight's (C, F) or (F, C) trailing dims, and any over ``expert``);
the all-reduces of expert gradients over ``data``. From the variables' shardings: the
expert weights each device holds against 1/E_p of the model's. The compiled step is then
run once on random tokens: the router statistics in its logs give the assignments the
capacity dropped and the busiest expert's load (the router at its initial weights).

Memory (section ``memory``): ``mixtral_8x7b`` (or another named MoE size) at real size,
built abstractly (``abstract_build``: nothing allocated) and its fit step compiled for
each ``<method>:<layout>:<mesh>`` run: ``lora`` (LoRA of rank r on every Dense /
EinsumDense but the routers: attention, LM head; the experts and the rest frozen) or ``full``
(every weight trained, AdamW), one sequence of T tokens per device of data x expert,
remat and precision as set, traced for the target device (``moe.compile_for``: an
H100's grouped matmul ``ragged_dot``, not XLA:CPU's block loop). Per device
(``memory_analysis``): arguments, temporaries, total = arguments + outputs - donated +
temporaries, against 80 GiB (H100); expert weights per device; the exchange's bytes per
all-to-all against the minimum. Rows of fewer blocks than the model has are flagged
partial; the whole depth is always compiled (the figure that counts).

Time (section ``time``, ``zoo.bench._moe_time``): on one device, the sparse layer's
forward + backward through each grouped matmul against the dense-masked computation
(every expert on every token, keras-hub's way), results checked equal, timed in turns.
"""

import collections
import dataclasses
import re
import time

import jax
import keras
import numpy as np

from zoo import distribution as zd
from zoo._compat import sublayers
from zoo.bench._gpt import build_model, compile_model
from zoo.bench._moe_time import TimingMismatch, check_agreement, format_time, time_rows  # noqa: F401 (the time section)
from zoo.bench._output import remat_warning, size_text, write_text
from zoo.config.bench_moe_settings import MOE_SECTIONS, MoEBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution.axes import DATA, EXPERT
from zoo.distribution.distributions import place_batch
from zoo.kernels import moe
from zoo.layers.moe_feed_forward import MoEFeedForward
from zoo.measure.comms_report import FAST_COMPILE, compiled_report
from zoo.measure.compiled_step import abstract_build, compile_fit_step, shard_bytes, state_groups, state_shardings
from zoo.measure.hardware import device_spec, platform_of
from zoo.models import GPTCausalLM
from zoo.models.gpt.gpt_configs import config_by_name
from zoo.training.finetune import enable_lora, is_lora_variable
from zoo.units import GIB

SEED = 0
EXCHANGES_PER_BLOCK = 4  # dispatch and combine, forward and backward
EXPERT_WEIGHT = re.compile(r"/expert_(gate|up|down)$")  # MoEFeedForward's (E, C, F) / (E, F, C) weights
ARRAY_DIMS = re.compile(r"\[([0-9,]*)\]")  # the dims of each array of a CollectiveOp.shape
FLOAT_ITEMSIZES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}  # HLO dtype -> bytes: the token exchanges' buffers
EXCHANGE_KINDS = ("all-to-all", "ragged-all-to-all")  # the collectives tokens travel in over 'expert'


# --- what every section shares ----------------------------------------------------------


def mesh_devices(spec):
    return int(np.prod([size for _, size in zd.parse_mesh_spec(spec)]))


def batch_split(spec):
    """How many ways layout ``expert`` splits the batch on ``spec``: data x expert."""
    axes = dict(zd.parse_mesh_spec(spec))
    return axes.get(DATA, 1) * axes.get(EXPERT, 1)


def moe_layers(model):
    return [layer for layer in sublayers(model) if isinstance(layer, MoEFeedForward)]


def expert_split(model, distribution):
    """``(bytes of expert weights per device, the model's expert bytes, parts)``: parts =
    how many ways every expert weight is split (None if they differ)."""
    trainable, non_trainable, _, _ = state_shardings(model, distribution)
    pairs = zip(model.trainable_variables + model.non_trainable_variables, trainable + non_trainable)
    held, whole, parts = 0, 0, set()
    for variable, sharding in pairs:
        if EXPERT_WEIGHT.search(variable.path):
            mine, total = (
                shard_bytes(variable, sharding),
                int(np.prod(variable.shape)) * np.dtype(variable.dtype).itemsize,
            )
            held, whole = held + mine, whole + total
            parts.add(total / mine)
    return held, whole, parts.pop() if len(parts) == 1 else None


def _dims(op):
    return [tuple(int(x) for x in dims.split(",") if x) for dims in ARRAY_DIMS.findall(op.shape)]


def expert_weight_gathers(comms, width, hidden):
    """All-gathers executed per step whose buffer has an expert weight's (C, F) or (F, C)
    trailing dims, or that run over an axis that includes ``expert``."""
    matrices = {(width, hidden), (hidden, width)}

    def gathers_experts(op):
        return any(len(d) == 3 and d[1:] in matrices for d in _dims(op)) or bool(op.axes and EXPERT in op.axes)

    return sum(op.executions for op in comms.select("all-gather") if gathers_experts(op))


def expert_gradient_reduces(comms, width, hidden):
    """All-reduces over ``data`` executed per step whose buffers are expert-shaped (the
    experts' gradients: one per MoE block is the minimum, XLA may combine them)."""
    matrices = {(width, hidden), (hidden, width)}
    return sum(
        op.executions
        for op in comms.select("all-reduce", (DATA,))
        if any(len(d) == 3 and d[1:] in matrices for d in _dims(op))
    )


def exchange_ops(comms):
    """The all-to-alls and ragged all-to-alls over ``expert`` of a ``CommsReport``."""
    return [op for kind in EXCHANGE_KINDS for op in comms.select(kind, (EXPERT,))]


def exchange_totals(comms):
    """``(token all-to-alls executed, count all-to-alls executed, bytes sent, dtype moved)``
    over ``expert`` per step: the floating exchanges (ragged ones too), the integer
    [N_e, E_l] counts and offsets, the bytes of all of them (a ragged all-to-all's: its
    whole send buffer, a bound), and the tokens' dtype as compiled (XLA:CPU widens bf16 to f32)."""
    ops = exchange_ops(comms)
    floating = [op for op in ops if _dtype(op) in FLOAT_ITEMSIZES]
    moved = {_dtype(op) for op in floating}
    if len(moved) > 1:
        raise ValueError(f"the token all-to-alls move several dtypes {sorted(moved)}; the minimum needs one")
    tokens = sum(op.executions for op in floating)
    return (
        tokens,
        sum(op.executions for op in ops) - tokens,
        sum(op.sent_bytes * op.executions for op in ops),
        moved.pop() if moved else None,
    )


def _dtype(op):
    return op.shape.split("[", 1)[0]


def compute_dtype(precision):
    return "bf16" if precision == "mixed_bfloat16" else "f32"


# --- exchange -------------------------------------------------------------------------


@dataclasses.dataclass
class ExchangeRow:
    """One compiled (and once run) fit step of the MoE GPT under layout ``expert``."""

    mesh: str
    capacity_factor: float | None
    expert_size: int = 0  # E_p
    tokens: int = 0  # N, tokens per device
    capacity: int = 0  # Q, rows per destination device
    sparse_blocks: int = 0
    token_exchanges: int = 0  # float all-to-alls executed per step
    count_exchanges: int = 0  # the [N_e, E_l] counts' all-to-alls
    sent: float = 0.0  # bytes each device sends in all-to-alls over expert per step
    moved: str = ""  # the tokens' dtype in the compiled all-to-alls
    compute: str = ""  # the layer's compute dtype (XLA:CPU moves bf16 as f32)
    minimum: float = 0.0  # the analytic minimum of the same, at the dtype moved
    expert_bytes: int = 0  # expert weights per device
    model_expert_bytes: int = 0
    expert_parts: float | None = None  # how many ways each expert weight is split
    weight_gathers: int = 0  # all-gathers of expert weights (or over an axis with expert) per step
    gradient_reduces: int = 0  # all-reduces of expert gradients over data per step
    assignments: int = 0  # (token, expert) assignments per step, all blocks and devices
    dropped_fraction: float = 0.0  # assignments the capacity dropped (mean over blocks, one step)
    max_load: float = 0.0  # the busiest expert's share over the mean
    exact: bool = True
    compile_s: float = 0.0
    compiled: object = dataclasses.field(default=None, repr=False)
    # compiled ahead of time for a topology (compile_exchange); routed bytes from a routing (routed_exchange_bytes)
    exchange: str = "all_to_all"  # the layer's expert_exchange
    buffers: float = 0.0  # bytes of the token exchanges' result (receive) buffers per step
    routed: tuple = ()  # bytes each device sends per step as routed (ragged), devices in shard order
    memory: object = None  # compiled_step.StepMemory
    all_reduces: int = 0  # all-reduces executed per step, over any axes (gradients, statistics, ...)
    all_reduce_sent: float = 0.0  # bytes each device sends in them per step

    @property
    def ratio(self):
        return self.sent / self.minimum

    @property
    def routed_ratios(self):
        """(mean, max) over devices of the routed bytes over the minimum (the fixed
        exchanges send their whole buffers whatever the routing: ``ratio``)."""
        if not self.routed:
            return self.ratio, self.ratio
        return float(np.mean(self.routed)) / self.minimum, max(self.routed) / self.minimum

    @property
    def dropped(self):
        """Assignments dropped per step, all blocks: the fraction x N x k x devices x blocks."""
        return self.dropped_fraction * self.assignments


def exchange_arguments(settings, capacity_factor, exchange="all_to_all"):
    """``GPTBackbone`` arguments of the exchange rows: every block sparse, no dropout;
    ``exchange``: the layers' ``expert_exchange``."""
    return {
        "vocabulary_size": settings.vocabulary_size,
        "num_layers": settings.num_layers,
        "hidden_dim": settings.hidden_dim,
        "num_query_heads": settings.num_query_heads,
        "num_key_value_heads": settings.num_key_value_heads,
        "intermediate_dim": settings.moe_intermediate_dim,
        "mlp": "swiglu",
        "norm": "rms",
        "max_sequence_length": settings.sequence_length,
        "tie_word_embeddings": False,
        "num_experts": settings.num_experts,
        "num_experts_per_token": settings.num_experts_per_token,
        "moe_intermediate_dim": settings.moe_intermediate_dim,
        "normalize_router_weights": True,
        "router_aux_loss_coefficient": 0.01,
        "capacity_factor": capacity_factor,
        "expert_exchange": exchange,
        "remat": "none",
    }


def measure_exchange(settings, mesh_spec, capacity_factor):
    """One ``ExchangeRow``: the fit step compiled on ``mesh_spec`` under layout expert, run once."""
    row = ExchangeRow(mesh_spec, capacity_factor)
    start = time.perf_counter()
    arguments = exchange_arguments(settings, capacity_factor)
    mesh = zd.make_mesh(mesh_spec, devices=jax.devices()[: mesh_devices(mesh_spec)])
    distribution = zd.distribution_for(GPTCausalLM, "expert", mesh, config=arguments)
    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    with zd.global_distribution(distribution):
        model = build_model(arguments, settings.precision)
        compile_model(model)
        model.optimizer.build(model.trainable_variables)
    tokens = ((settings.batch_size, settings.sequence_length), "int32")  # next-token targets: the same shape
    row.compiled, _ = compile_fit_step(model, distribution, tokens, tokens, compiler_options=FAST_COMPILE)
    comms = compiled_report(row.compiled, distribution.device_mesh)
    row.compile_s = time.perf_counter() - start
    _fill_exchange(row, settings, comms, model, distribution)
    row.max_load, row.dropped_fraction = run_once(row.compiled, model, distribution, settings)
    return row


def _fill_exchange(row, settings, comms, model, distribution):
    k, width, hidden = settings.num_experts_per_token, settings.hidden_dim, settings.moe_intermediate_dim
    row.expert_size = zd.mesh_axis_size(distribution.device_mesh, EXPERT)
    row.tokens = settings.batch_size * settings.sequence_length // batch_split(row.mesh)
    row.capacity = moe.capacity(
        row.tokens,
        num_experts_per_token=k,
        axis_size=row.expert_size,
        experts_per_device=settings.num_experts // row.expert_size,
        capacity_factor=row.capacity_factor,
    )
    row.sparse_blocks = len(moe_layers(model))
    row.assignments = settings.batch_size * settings.sequence_length * k * row.sparse_blocks
    row.token_exchanges, row.count_exchanges, row.sent, row.moved = exchange_totals(comms)
    row.compute = compute_dtype(settings.precision)
    per_exchange = moe.minimum_exchange_bytes(
        row.tokens, num_experts_per_token=k, width=width, itemsize=FLOAT_ITEMSIZES[row.moved], axis_size=row.expert_size
    )
    row.minimum = EXCHANGES_PER_BLOCK * row.sparse_blocks * per_exchange
    row.expert_bytes, row.model_expert_bytes, row.expert_parts = expert_split(model, distribution)
    row.weight_gathers = expert_weight_gathers(comms, width, hidden)
    row.gradient_reduces = expert_gradient_reduces(comms, width, hidden)
    row.exact = comms.exact


def run_once(compiled, model, distribution, settings):
    """Run the compiled step once on random tokens; ``(max_load, dropped_fraction)`` from its logs."""
    shardings = state_shardings(model, distribution)
    state = tuple(
        [jax.device_put(v.value, s) for v, s in zip(group, layout)]
        for group, layout in zip(state_groups(model), shardings)
    )
    x, y = random_tokens(settings)
    logs, _ = compiled(state, tuple(place_batch(distribution, x, y)))
    return float(logs["router_max_load"]), float(logs["router_dropped_fraction"])


# --- the exchange compiled ahead of time for an accelerator's topology ------------------


def compile_exchange(
    settings, mesh_spec, capacity_factor, *, devices, platform, exchange="all_to_all", compiler_options=None
):
    """One ``ExchangeRow`` of the exchange rows' fit step compiled for ``devices``, never
    run: e.g. a TPU slice's compile-only devices (``jax.experimental.topologies``), which
    the process need not have. The model is built abstractly (nothing allocated), its MoE
    layers traced for ``platform`` (``moe.compile_for``: ``ragged_dot`` on GPU/TPU) with
    ``expert_exchange=exchange``, and the step compiled with ``compiler_options`` (None:
    the backend's own, that compiler's whole pipeline). Fills the exchange's bytes,
    buffers, the all-reduces and the memory per device; no drops or loads (nothing runs)."""
    row = ExchangeRow(mesh_spec, capacity_factor, exchange=exchange)
    start = time.perf_counter()
    arguments = exchange_arguments(settings, capacity_factor, exchange)
    mesh = zd.make_mesh(mesh_spec, devices=list(devices)[: mesh_devices(mesh_spec)])
    distribution = zd.distribution_for(GPTCausalLM, "expert", mesh, config=arguments)
    keras.backend.clear_session()
    tokens = ((settings.batch_size, settings.sequence_length), "int32")
    with moe.compile_for(platform):
        model = abstract_build(lambda: build_model(arguments, settings.precision), compile_model, distribution)
        row.compiled, row.memory = compile_fit_step(
            model, distribution, tokens, tokens, compiler_options=compiler_options
        )
    comms = compiled_report(row.compiled, distribution.device_mesh)
    row.compile_s = time.perf_counter() - start
    _fill_exchange(row, settings, comms, model, distribution)
    row.buffers = sum(op.bytes * op.executions for op in exchange_ops(comms) if _dtype(op) in FLOAT_ITEMSIZES)
    row.all_reduces = comms.count("all-reduce")
    row.all_reduce_sent = comms.sent_bytes("all-reduce")
    return row


def recorded_routing(settings):
    """The expert ids (i32[B * T, k], one per MoE block, the global batch in order) the
    exchange rows' model routes ``run_once``'s tokens to at its initial weights (the same
    seed), computed on this process's default device with no distribution: the routing
    that decides what a ragged exchange sends."""
    arguments = exchange_arguments(settings, None)
    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    with zd.global_distribution(None):
        model = build_model(arguments, settings.precision)
    x, _ = random_tokens(settings)
    routings, route = [], moe.route

    def recording(*args, **kwargs):  # the layers call moe.route once per block
        result = route(*args, **kwargs)
        routings.append(np.asarray(result[1]))  # concrete: the model runs eagerly
        return result

    moe.route = recording
    try:
        with zd.global_distribution(None):
            model(x, training=False)
    finally:
        moe.route = route
    if len(routings) != settings.num_layers:
        raise RuntimeError(f"recorded {len(routings)} routings for {settings.num_layers} MoE blocks")
    return routings


def ragged_rows_sent(routings, *, mesh_spec, num_experts):
    """Rows each device sends per step in the ragged exchanges (dispatch and combine,
    forward and backward) of ``routings`` (i32[B * T, k] expert ids per MoE block), the
    batch split over data x expert as layout ``expert`` splits it (shard d * E_p + e, on
    device (d, e), holds the (d * E_p + e)-th slice). Per block device (d, e) dispatches
    the rows it routes to the other devices of its ``expert`` group (out) and returns
    those the others routed to it (in); the backward sends the same again (each
    transpose reverses its exchange): 2 (out + in). Returns f64[D * E_p], shard order."""
    axes = dict(zd.parse_mesh_spec(mesh_spec))
    data, experts = axes.get(DATA, 1), axes[EXPERT]
    local = num_experts // experts
    rows = np.zeros(data * experts)
    for expert_ids in routings:
        shards = np.asarray(expert_ids).reshape(data, experts, -1)  # [D, E_p, N * k]
        counts = np.array(
            [[np.bincount(shards[d, e] // local, minlength=experts) for e in range(experts)] for d in range(data)]
        )  # [D, E_p source, E_p destination]
        own = np.einsum("dee->de", counts)  # rows a device routes to itself: not sent
        out, into = counts.sum(axis=2) - own, counts.sum(axis=1) - own  # [D, E_p] each
        rows += 2.0 * (out + into).reshape(-1)
    return rows


def routed_exchange_bytes(settings, row, routings):
    """Bytes each device of ``row``'s mesh sends per step in a ragged exchange of
    ``routings``: ``ragged_rows_sent`` x C x the itemsize moved."""
    rows = ragged_rows_sent(routings, mesh_spec=row.mesh, num_experts=settings.num_experts)
    return tuple(float(r) * settings.hidden_dim * FLOAT_ITEMSIZES[row.moved] for r in rows)


def random_tokens(settings):
    """``run_once``'s (x, y): random token ids (B, T), int32."""
    rng = np.random.default_rng(SEED)
    return tuple(
        rng.integers(0, settings.vocabulary_size, (settings.batch_size, settings.sequence_length), dtype=np.int32)
        for _ in range(2)
    )


def _exchange_name(row):
    if row.exchange == "ragged":
        return "ragged (dropless)"
    return f"all_to_all, {'dropless' if row.capacity_factor is None else f'capacity {row.capacity_factor:g}'}"


def format_topology_exchange(settings, rows, topology):
    """The table of ``compile_exchange`` rows compiled for ``topology`` (its name and devices)."""
    name, devices = topology
    lines = [
        (
            f"Exchange compiled ahead of time for {devices[0].platform.upper()} topology {name} ({len(devices)} "
            f"{devices[0].device_kind} devices), never run: GPTCausalLM, {settings.num_layers} MoE blocks, "
            f"C={settings.hidden_dim}, H={settings.num_query_heads}, K={settings.num_key_value_heads}, E={settings.num_experts} "
            f"experts of F={settings.moe_intermediate_dim}, top {settings.num_experts_per_token}, V={settings.vocabulary_size}, "
            f"T={settings.sequence_length}, global batch {settings.batch_size}, {settings.precision}, remat none; layout "
            f"expert; the fit step built abstractly and compiled with the backend's default options (experts' grouped "
            f"matmul {moe.grouped_matmul_implementation(devices[0].platform)}); jax {jax.__version__}, keras {keras.__version__}."
        ),
        "",
        (
            "Per device and step (all-to-alls and ragged-all-to-alls over 'expert' from the compiled HLO, loop trips "
            "included; buffers: their result (receive) buffers; sent: a fixed all-to-all's (E_p-1)/E_p of its buffer, a "
            "ragged one's whole send buffer (a bound); routed: what the ragged exchange sends for the routing of the "
            "exchange table's random tokens at the initial weights (computed on the attached device; mean and max over "
            "devices), 2 x (rows out + rows in) per block x C x itemsize; minimum = 4 x blocks x N x k x C x itemsize x "
            "(E_p-1)/E_p; all-reduces: every one in the step, over any axes, and what a device sends in them; "
            "memory_analysis: total = arguments + outputs - donated + temporaries):"
        ),
        "",
        (
            "| mesh | E_p | exchange | token exchanges (+ counts, offsets) | dtype moved | buffers | sent (HLO) | "
            "routed: mean (max) | minimum | sent / minimum: mean (max) | all-reduces (sent) | arguments | temp | total | compile (s) |"
        ),
        "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        bound = "" if row.exact else ">= "
        mean, most = row.routed_ratios
        routed = f"{size_text(np.mean(row.routed))} ({size_text(max(row.routed))})" if row.routed else "= sent"
        sent = f"<= {size_text(row.sent)}" if row.exchange == "ragged" else size_text(row.sent)
        m = row.memory
        lines.append(
            f"| {row.mesh} | {row.expert_size} | {_exchange_name(row)} | {bound}{row.token_exchanges} (+{row.count_exchanges}) | "
            f"{row.moved} | {size_text(row.buffers)} | {sent} | {routed} | {size_text(row.minimum)} | **{mean:.3f}** ({most:.3f}) | "
            f"{bound}{row.all_reduces} ({size_text(row.all_reduce_sent)}) | {size_text(m.argument)} | {size_text(m.temp)} | {size_text(m.peak)} | {row.compile_s:.0f} |"
        )
    return lines


def exchange_rows(settings, report=print):
    rows = []
    for mesh_spec in settings.meshes:
        for capacity_factor in settings.capacity_factors:
            row = measure_exchange(settings, mesh_spec, capacity_factor)
            report(
                f"exchange {mesh_spec} capacity {_factor(capacity_factor)}: sent {size_text(row.sent)} vs minimum "
                f"{size_text(row.minimum)} ({row.ratio:.3f}x), dropped {row.dropped_fraction:.2%}, compiled in {row.compile_s:.0f} s"
            )
            rows.append(row)
    return rows


def _factor(capacity_factor):
    return "dropless" if capacity_factor is None else f"{capacity_factor:g}"


def _moved(moved, compute):
    return moved if moved == compute else f"{moved} ({compute} compute)"


def _parts(parts):
    return "-" if parts is None else f"1/{parts:g}"


def format_exchange(settings, rows):
    lines = [
        (
            f"Exchange: GPTCausalLM, {settings.num_layers} MoE blocks, C={settings.hidden_dim}, H={settings.num_query_heads}, "
            f"K={settings.num_key_value_heads}, E={settings.num_experts} experts of F={settings.moe_intermediate_dim}, top "
            f"{settings.num_experts_per_token}, V={settings.vocabulary_size}, T={settings.sequence_length}, global batch "
            f"{settings.batch_size}, {settings.precision}, remat none; layout expert; the fit step compiled for "
            f"{jax.devices()[0].platform} devices (simulated) and run once on random tokens; jax {jax.__version__}, keras {keras.__version__}."
        ),
        "",
        (
            "Per device and step (all-to-alls over 'expert' from the compiled HLO, loop trips included; minimum = 4 exchanges x "
            "blocks x N x k x C x itemsize x (E_p-1)/E_p, zoo.kernels.moe.minimum_exchange_bytes, at the itemsize of the dtype "
            "moved (XLA:CPU widens a bf16 all-to-all to f32; GPU and TPU move bf16); Q = the rows each device sends "
            "each other, zoo.kernels.moe.capacity; expert weights from the variables' shardings; expert all-gathers: all-gathers "
            "of an expert-weight-shaped buffer, or over an axis with 'expert'; dropped: assignments past the capacity in one "
            "run of the step, the router at its initial weights):"
        ),
        "",
        (
            "| mesh | E_p | capacity factor | N tokens / device | Q | token all-to-alls (+ counts) | dtype moved | sent | minimum | sent / minimum | "
            "expert weights / device | of the experts | expert all-gathers | expert-grad all-reduces over data | assignments dropped | max load | compile (s) |"
        ),
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        bound = "" if row.exact else ">= "
        lines.append(
            f"| {row.mesh} | {row.expert_size} | {_factor(row.capacity_factor)} | {row.tokens:,} | {row.capacity:,} | "
            f"{bound}{row.token_exchanges} (+{row.count_exchanges}) | {_moved(row.moved, row.compute)} | {size_text(row.sent)} | {size_text(row.minimum)} | "
            f"**{row.ratio:.3f}** | {size_text(row.expert_bytes)} | {_parts(row.expert_parts)} | {row.weight_gathers} | "
            f"{row.gradient_reduces} | {row.dropped_fraction:.2%} ({row.dropped:,.0f}) | {row.max_load:.2f} | {row.compile_s:.0f} |"
        )
    return lines


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


# --- the command ----------------------------------------------------------------------


def check_settings(settings):
    """Refuse, before compiling anything, numbers the meshes, the model or the devices cannot take."""
    if not settings.sections or any(section not in MOE_SECTIONS for section in settings.sections):
        raise ValueError(f"sections must name some of {list(MOE_SECTIONS)}, got {settings.sections!r}")
    meshes = []
    if "exchange" in settings.sections:
        meshes += list(settings.meshes)
        for spec in settings.meshes:
            axes = dict(zd.parse_mesh_spec(spec))
            if set(axes) != {DATA, EXPERT} or min(axes.values()) < 1 or axes[EXPERT] < 2:
                raise ValueError(
                    f"mesh {spec!r}: the exchange rows run layout expert on a mesh 'data=D,expert=P' with P >= 2 (sizes given, no -1)"
                )
            if settings.num_experts % axes[EXPERT]:
                raise ValueError(
                    f"num_experts {settings.num_experts} is not divisible by the 'expert' axis of size {axes[EXPERT]} of mesh {spec!r}"
                )
            if settings.batch_size % batch_split(spec):
                raise ValueError(
                    f"batch_size {settings.batch_size} is not divisible by data x expert = {batch_split(spec)} of mesh {spec!r}"
                )
        if settings.num_experts_per_token > settings.num_experts:
            raise ValueError(
                f"num_experts_per_token {settings.num_experts_per_token} exceeds num_experts {settings.num_experts}"
            )
    if "memory" in settings.sections:
        model = config_by_name(settings.memory_config)
        if not model.get("num_experts"):
            raise ValueError(
                f"memory_config {settings.memory_config!r} has no experts (num_experts={model.get('num_experts')}); name a MoE size"
            )
        deeper = [n for n in settings.memory_partial_layers if n >= model["num_layers"]]
        if deeper:
            raise ValueError(
                f"memory_partial_layers {deeper} are not fewer than the {model['num_layers']} blocks of {settings.memory_config!r}"
            )
        device_spec(settings.memory_target)  # an unknown kind raises naming the known ones
        for run in settings.memory_runs:
            spec = parse_run(run)[2]
            if (
                dict(zd.parse_mesh_spec(spec)).get(EXPERT, 1) < 2
                or min(size for _, size in zd.parse_mesh_spec(spec)) < 1
            ):
                raise ValueError(
                    f"memory run {run!r}: its mesh needs an 'expert' axis of size >= 2, every size given (no -1)"
                )
            meshes.append(spec)
    if "time" in settings.sections and settings.time_experts_per_token > settings.time_experts:
        raise ValueError(
            f"time_experts_per_token {settings.time_experts_per_token} exceeds time_experts {settings.time_experts}"
        )
    needed = max((mesh_devices(spec) for spec in meshes), default=1)
    if needed > len(jax.devices()):
        raise ValueError(
            f"the meshes need {needed} devices but JAX has {len(jax.devices())}; run with --simulate-devices {needed}"
        )


def run_benchmark(settings, report=print):
    """The tables of ``settings.sections``, printed as markdown (``report``) and written to
    ``settings.output``. Returns ``{"exchange": [ExchangeRow], "memory": [MemoryRow], "time": [TimeRow]}``."""
    check_settings(settings)
    results, lines = {}, []
    if "exchange" in settings.sections:
        results["exchange"] = exchange_rows(settings, report)
        lines += format_exchange(settings, results["exchange"])
    if "memory" in settings.sections:
        results["memory"] = memory_rows(settings, report)
        lines += ([""] if lines else []) + format_memory(settings, results["memory"])
    if "time" in settings.sections:
        results["time"] = time_rows(settings, report)
        lines += ([""] if lines else []) + format_time(settings, results["time"])
    text = "\n".join(lines)
    report(text)
    if settings.output:
        write_text(settings.output, text)
    return results
