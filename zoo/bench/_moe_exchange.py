"""``zoo bench moe``'s exchange section: the tokens' all-to-alls over ``expert`` compiled
as fit compiles them, against the analytic minimum (``zoo.bench.moe``'s docstring), and
the same exchange compiled ahead of time for an accelerator's topology."""

import dataclasses
import time

import jax
import keras
import numpy as np

from zoo import distribution as zd
from zoo.bench._gpt import build_model, compile_model
from zoo.bench._moe_common import (
    EXCHANGES_PER_BLOCK,
    FLOAT_ITEMSIZES,
    SEED,
    _dtype,
    batch_split,
    compute_dtype,
    exchange_ops,
    exchange_totals,
    expert_gradient_reduces,
    expert_split,
    expert_weight_gathers,
    mesh_devices,
    moe_layers,
)
from zoo.bench._output import size_text
from zoo.distribution.axes import DATA, EXPERT
from zoo.distribution.distributions import place_batch
from zoo.kernels import moe
from zoo.measure.comms_report import FAST_COMPILE, compiled_report
from zoo.measure.compiled_step import abstract_build, compile_fit_step, state_groups, state_shardings
from zoo.models import GPTCausalLM

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
