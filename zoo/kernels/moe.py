"""Sparse Mixture-of-Experts feed-forward: routing, grouped expert matmuls, expert parallelism.

Pure JAX. ``expert_parallel_moe`` runs on one shard inside ``jax.shard_map``; the rest
are plain functions any shard (or one device) calls. Letters (docs/architecture.md):
N tokens on this shard, C model width, E experts, k experts per token, F an expert's
hidden width, N_e the size of the ``expert`` mesh axis (E_p in the docs), E_l = E / N_e
experts held per device, A = N * k (token, expert) assignments, Q the capacity: rows a
shard sends to each other shard.

Routing (``route``): softmax over the E router logits in float32, the k largest kept
(``jax.lax.top_k``), renormalised to sum 1 or not (Mixtral does, Qwen2-MoE's
``norm_topk_prob=False`` does not). The output is ``sum_j w_j * expert_{e_j}(x)``.

Tokens grouped by expert: the A assignments are sorted by expert id (stable), so each
expert's tokens are one contiguous run of rows, and the expert MLPs run as a grouped
matmul over the runs (``zoo.kernels.grouped_matmul.expert_mlp``: ``jax.lax.ragged_dot``
on GPU and TPU, JAX's Pallas ``megablox`` kernel when asked, a loop over row blocks on
XLA:CPU).

Expert parallelism over an axis of N_e devices (``expert_parallel_moe``), each holding
E_l experts and its own N tokens:

1. route, sort the A assignments by expert (so by destination device: expert e lives on
   device e // E_l), and rank each within its destination;
2. dispatch: one ``all_to_all`` of a [N_e, Q, C] buffer, row (d, r) the token of this
   shard's r-th assignment to device d, plus the [N_e, E_l] counts per expert;
3. the received [N_e * Q, C] rows, sorted by local expert, through the grouped MLP;
4. combine: the outputs go back through the inverse ``all_to_all`` and each token sums
   its k outputs times their router weights.

Each token's hidden vector crosses the wire once per selected expert that lives
elsewhere: the bytes per exchange are Q * C * (N_e - 1) per device, against the
minimum A * C * (N_e - 1) / N_e of a ragged exchange (``minimum_exchange_bytes``). The
capacity Q is ``ceil(capacity_factor * A / N_e)`` with a ``capacity_factor``; past it a
shard's assignments to one device are dropped (the token keeps its other experts; the
shared expert and the residual still carry it), counted in the statistics, never silent.
``capacity_factor=None`` is dropless: Q = N * min(k, E_l), enough for every assignment
even when every token picks one device, at N_e * min(k, E_l) / k times the minimum bytes.

``exchange="ragged"`` (``ragged_expert_parallel_moe``) sends exactly the routed rows
with ``jax.lax.ragged_all_to_all``: dropless at the minimum bytes, the receive buffer
sized for the worst case (N_e * N * min(k, E_l) rows) but only the routed rows moved.
XLA:CPU cannot run it ("HLO opcode ragged-all-to-all is not supported by XLA:CPU"): on
CPU the tests run the same code with ``emulated_ragged_all_to_all`` (the op's
semantics from an all-gather), which checks every offset and size against the dense
reference; the op itself is GPU/TPU's, not run here (docs/moe.md, limits).

Custom VJP: none. Autodiff's transpose of each ``all_to_all`` is the inverse
``all_to_all`` (the backward sends the same bytes again), of the gathers by sorted order
scatters, of the block loop a loop; none is wasteful.
"""

import math

import jax
import jax.numpy as jnp

from zoo.config.choices import EXPERT_EXCHANGES
from zoo.kernels.collective_matmul import _varying_axes, vary_over
from zoo.kernels.grouped_matmul import GROUPED_MATMULS, compile_for, expert_mlp, grouped_matmul_implementation

__all__ = [
    "EXCHANGES",
    "GROUPED_MATMULS",
    "emulated_ragged_all_to_all",
    "ragged_expert_parallel_moe",
    "replicated_expert_parallel_moe",
    "capacity",
    "compile_for",
    "check_experts",
    "dropped_assignments",
    "expert_mlp",
    "expert_parallel_moe",
    "grouped_matmul_implementation",
    "load_balance_loss",
    "minimum_exchange_bytes",
    "dense_moe",
    "moe_reference",
    "route",
    "router_z_loss",
    "sparse_moe",
]

EXCHANGES = EXPERT_EXCHANGES  # how tokens travel over the expert axis: padded buffers, or exactly the routed rows


# --- routing --------------------------------------------------------------------------


def route(router_logits, *, num_experts_per_token, normalize):
    """Top-k routing. router_logits [N, E] -> (weights f32[N, k], expert_ids i32[N, k],
    probabilities f32[N, E]): softmax in float32, the k largest, renormalised to sum 1
    when ``normalize``. Ties go to the lower expert id (``jax.lax.top_k``)."""
    probabilities = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)  # f32[N, E]
    weights, expert_ids = jax.lax.top_k(probabilities, num_experts_per_token)  # f32[N, k], i32[N, k]
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, expert_ids.astype(jnp.int32), probabilities


def load_balance_loss(probabilities, expert_ids, *, num_experts):
    """Switch / Mixtral auxiliary loss: ``E * sum_e f_e * P_e`` with f_e the fraction of
    the N * k assignments routed to expert e (summed over the k slots, as Hugging Face's
    ``load_balancing_loss_func``) and P_e the mean router probability of e. It is k for
    a uniform router and grows as the load concentrates. probabilities f32[N, E],
    expert_ids i32[N, k] -> f32 scalar."""
    assigned = jax.nn.one_hot(expert_ids, num_experts, dtype=jnp.float32)  # [N, k, E]
    fraction = jnp.mean(assigned, axis=0)  # [k, E]
    mean_probability = jnp.mean(probabilities, axis=0)  # [E]
    return num_experts * jnp.sum(fraction * mean_probability[None, :])


def router_z_loss(router_logits):
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2 (f32 scalar)."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(router_logits.astype(jnp.float32), axis=-1)))


# --- the single-device reference --------------------------------------------------------


def moe_reference(x, *, router_kernel, expert_gate, expert_up, expert_down, num_experts_per_token, normalize):
    """Route, then every expert on every token weighted by the router (``dense_moe``):
    x [N, C], router_kernel [C, E], expert_gate / expert_up [E, C, F], expert_down
    [E, F, C] -> [N, C]. What keras-hub's Qwen3-MoE computes; the tests' oracle."""
    logits = jnp.einsum("nc,ce->ne", x.astype(jnp.float32), router_kernel.astype(jnp.float32))
    weights, expert_ids, _ = route(logits, num_experts_per_token=num_experts_per_token, normalize=normalize)
    return dense_moe(x, weights, expert_ids, expert_gate=expert_gate, expert_up=expert_up, expert_down=expert_down)


def dense_moe(x, weights, expert_ids, *, expert_gate, expert_up, expert_down):
    """Every expert on every token, each output weighted by the token's routing weight
    for that expert (zero for the unselected): x [N, C], weights f32[N, k], expert_ids
    i32[N, k], expert weights [E, ...] -> [N, C]. E times the work of ``sparse_moe``."""
    num_experts = expert_gate.shape[0]
    combine = jnp.sum(jax.nn.one_hot(expert_ids, num_experts) * weights[..., None], axis=1)  # [N, E]
    hidden = jax.nn.silu(jnp.einsum("nc,ecf->enf", x, expert_gate)) * jnp.einsum(
        "nc,ecf->enf", x, expert_up
    )  # [E, N, F]
    outputs = jnp.einsum("enf,efc->enc", hidden, expert_down)  # [E, N, C]
    return jnp.einsum("ne,enc->nc", combine.astype(x.dtype), outputs)


# --- one device: every expert local -------------------------------------------------------


def _sorted_assignments(expert_ids):
    """The A = N * k assignments sorted by expert: (order i32[A] into the flat [N * k]
    assignments, their token i32[A], their expert i32[A])."""
    num_tokens, k = expert_ids.shape
    flat = expert_ids.reshape(-1)  # [A]
    order = jnp.argsort(flat, stable=True)  # [A]
    return order.astype(jnp.int32), (order // k).astype(jnp.int32), flat[order]


def sparse_moe(x, weights, expert_ids, *, expert_gate, expert_up, expert_down, implementation=None):
    """Every expert on this device: x [N, C], weights f32[N, k], expert_ids i32[N, k],
    expert weights [E, ...] -> [N, C]. Only each token's k experts run."""
    num_experts = expert_gate.shape[0]
    order, token, expert = _sorted_assignments(expert_ids)
    group_sizes = jnp.bincount(expert, length=num_experts).astype(jnp.int32)  # i32[E]
    outputs = expert_mlp(
        x[token],
        group_sizes,
        expert_gate=expert_gate,
        expert_up=expert_up,
        expert_down=expert_down,
        implementation=implementation,
    )  # [A, C]
    weighted = outputs * weights.reshape(-1)[order][:, None].astype(outputs.dtype)  # [A, C]
    return jnp.zeros_like(x).at[token].add(weighted)  # [N, C]


# --- expert parallelism ---------------------------------------------------------------------


def capacity(num_tokens, *, num_experts_per_token, axis_size, experts_per_device, capacity_factor):
    """Q, the rows one shard sends to each device of the expert axis: dropless
    (``capacity_factor`` None) N * min(k, E_l); else ceil(capacity_factor * N * k / N_e)."""
    if capacity_factor is None:
        return num_tokens * min(num_experts_per_token, experts_per_device)
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive (or None for dropless), got {capacity_factor!r}")
    return max(1, math.ceil(capacity_factor * num_tokens * num_experts_per_token / axis_size))


def dropped_assignments(expert_ids, *, num_experts, axis_size, capacity):
    """How many (token, expert) assignments of one shard the capacity drops: for each
    destination device, its assignments past the first ``capacity`` (i32 scalar)."""
    destination = expert_ids.reshape(-1) // (num_experts // axis_size)
    per_device = jnp.bincount(destination, length=axis_size)
    return jnp.sum(jnp.maximum(per_device - capacity, 0)).astype(jnp.int32)


def minimum_exchange_bytes(num_tokens, *, num_experts_per_token, width, itemsize, axis_size):
    """The bytes one device sends in one exchange (dispatch or combine) when every
    assignment to an expert elsewhere travels once: N * k * C * itemsize * (N_e - 1) / N_e
    on average over devices (a balanced router)."""
    return num_tokens * num_experts_per_token * width * itemsize * (axis_size - 1) / axis_size


def check_experts(num_experts, *, axis_size, axis_name="expert"):
    """Raises unless the E experts split evenly over the expert axis."""
    if num_experts % axis_size:
        raise ValueError(
            f"num_experts {num_experts} is not divisible by the {axis_name!r} mesh axis of size {axis_size}"
        )


def expert_parallel_moe(
    x,
    weights,
    expert_ids,
    *,
    expert_gate,
    expert_up,
    expert_down,
    axis_name,
    axis_size,
    num_experts,
    capacity_factor=None,
    implementation=None,
):
    """One shard of the expert-parallel MoE: dispatch, local experts, combine.

    x [N, C] this shard's tokens; weights f32[N, k] and expert_ids i32[N, k] their routing
    (over all E experts); expert_gate / expert_up [E_l, C, F], expert_down [E_l, F, C]
    this device's experts (device i holds experts i * E_l .. (i + 1) * E_l - 1 of the
    ``axis_name`` axis of ``axis_size`` devices). Returns (y [N, C], dropped i32: this
    shard's assignments the capacity dropped; 0 when dropless).
    """
    check_experts(num_experts, axis_size=axis_size, axis_name=axis_name)
    num_tokens, k = expert_ids.shape
    local = num_experts // axis_size  # E_l
    rows = capacity(
        num_tokens,
        num_experts_per_token=k,
        axis_size=axis_size,
        experts_per_device=local,
        capacity_factor=capacity_factor,
    )  # Q
    order, token, expert = _sorted_assignments(expert_ids)  # i32[A] each, sorted by expert
    destination = expert // local  # i32[A], non-decreasing
    per_device = jnp.bincount(destination, length=axis_size)  # i32[N_e]
    rank = jnp.arange(expert.shape[0], dtype=jnp.int32) - (jnp.cumsum(per_device) - per_device)[destination]
    kept = rank < rows  # bool[A]
    slot = jnp.where(kept, destination * rows + rank, axis_size * rows)  # row of the send buffer; past it: dropped
    # f32[N_e * Q, C]: row d * Q + r is this shard's r-th assignment to device d (zeros where none)
    send = jnp.zeros((axis_size * rows, x.shape[-1]), x.dtype).at[slot].set(x[token], mode="drop")
    kept_expert = jnp.where(kept, expert, num_experts)  # dropped ones counted nowhere
    counts = jnp.bincount(kept_expert, length=num_experts + 1)[:num_experts].reshape(axis_size, local)  # i32[N_e, E_l]

    received = jax.lax.all_to_all(
        send.reshape(axis_size, rows, -1), axis_name, 0, 0, tiled=True
    )  # [N_e, Q, C] by source
    received_counts = jax.lax.all_to_all(counts, axis_name, 0, 0, tiled=True)  # i32[N_e, E_l]: source s sent e's rows
    outputs = _local_experts(
        received,
        received_counts,
        expert_gate=expert_gate,
        expert_up=expert_up,
        expert_down=expert_down,
        implementation=implementation,
    )  # [N_e, Q, C]
    returned = jax.lax.all_to_all(outputs, axis_name, 0, 0, tiled=True).reshape(axis_size * rows, -1)  # [N_e * Q, C]

    mine = returned.at[slot].get(mode="fill", fill_value=0)  # [A, C]; dropped rows: 0
    weighted = mine * weights.reshape(-1)[order][:, None].astype(mine.dtype)
    y = jnp.zeros_like(x).at[token].add(weighted)  # [N, C]
    return y, jnp.sum(~kept).astype(jnp.int32)


def _local_experts(received, received_counts, *, expert_gate, expert_up, expert_down, implementation):
    """received [N_e, Q, C] (from each source, its rows sorted by local expert, then
    padding), received_counts i32[N_e, E_l] -> the expert outputs in the same places."""
    sources, rows, width = received.shape
    # each received row's local expert: row r of source s belongs to the expert whose
    # cumulative count first exceeds r; padding rows get E_l
    row = jnp.arange(rows, dtype=jnp.int32)
    expert = jax.vmap(lambda c: jnp.searchsorted(jnp.cumsum(c), row, side="right"))(received_counts)  # i32[N_e, Q]
    outputs = _experts_in_arrival_order(
        received.reshape(sources * rows, width),
        expert.reshape(-1),
        jnp.sum(received_counts, axis=0),
        expert_gate=expert_gate,
        expert_up=expert_up,
        expert_down=expert_down,
        implementation=implementation,
    )  # [N_e * Q, C], padding rows 0
    return outputs.reshape(sources, rows, -1)


def _experts_in_arrival_order(rows, local_expert, group_sizes, *, expert_gate, expert_up, expert_down, implementation):
    """rows [R, C] as they arrived, local_expert i32[R] (E_l: a row of no expert), group_sizes
    [E_l] rows per expert -> each row's expert output [R, C] in the same places (0 for E_l's):
    the rows grouped by expert (a stable sort, E_l's last) for ``expert_mlp``, then put back."""
    order = jnp.argsort(local_expert.astype(jnp.int32), stable=True)  # i32[R]
    grouped = expert_mlp(
        rows[order],
        group_sizes.astype(jnp.int32),
        expert_gate=expert_gate,
        expert_up=expert_up,
        expert_down=expert_down,
        implementation=implementation,
    )  # [R, C], rows past the groups 0
    return jnp.zeros_like(grouped).at[order].set(grouped)


# --- the ragged exchange --------------------------------------------------------------------


def ragged_expert_parallel_moe(
    x,
    weights,
    expert_ids,
    *,
    expert_gate,
    expert_up,
    expert_down,
    axis_name,
    axis_size,
    num_experts,
    implementation=None,
    ragged_all_to_all=None,
):
    """``expert_parallel_moe`` with exactly the routed rows sent (dropless, no capacity).

    The A sorted assignments go to their devices in one ``ragged_all_to_all``; each
    device's rows land after those of the lower sources (offsets from the all-gathered
    [N_e, N_e] send counts) with the [N_e, E_l] counts per expert beside them; the
    outputs return by the inverse ragged exchange to their senders' sorted places.
    ``ragged_all_to_all``: the collective (default ``jax.lax.ragged_all_to_all``;
    ``emulated_ragged_all_to_all`` on CPU). Returns (y [N, C], dropped = 0).
    """
    check_experts(num_experts, axis_size=axis_size, axis_name=axis_name)
    exchange = ragged_all_to_all or jax.lax.ragged_all_to_all
    num_tokens, k = expert_ids.shape
    local = num_experts // axis_size
    order, token, expert = _sorted_assignments(expert_ids)  # i32[A] each
    per_device = jnp.bincount(expert // local, length=axis_size).astype(jnp.int32)  # i32[N_e]: rows to each device
    sent = jax.lax.all_gather(per_device, axis_name)  # i32[N_e (source), N_e (destination)]
    me = jax.lax.axis_index(axis_name)
    send_offsets = jnp.cumsum(per_device) - per_device  # where each destination's rows start here
    land_offsets = (jnp.cumsum(sent, axis=0) - sent)[me]  # where my rows start on each destination
    receive_sizes = sent[:, me]  # i32[N_e]: rows from each source
    receive_offsets = jnp.cumsum(receive_sizes) - receive_sizes
    counts = jnp.bincount(expert, length=num_experts).reshape(axis_size, local).astype(jnp.int32)  # i32[N_e, E_l]
    received_counts = jax.lax.all_to_all(counts, axis_name, 0, 0, tiled=True)  # i32[N_e, E_l] by source

    rows = axis_size * num_tokens * min(k, local)  # the worst case any device receives
    sorted_rows = x[token]  # [A, C]
    received = exchange(
        sorted_rows,
        _buffer_like((rows, x.shape[-1]), sorted_rows),
        send_offsets,
        per_device,
        land_offsets,
        receive_sizes,
        axis_name=axis_name,
    )  # [rows, C]: source 0's rows, then source 1's, ...; the rest zeros
    outputs = _experts_in_arrival_order(
        received,
        _received_local_experts(rows, receive_offsets, receive_sizes, received_counts),
        jnp.sum(received_counts, axis=0),
        expert_gate=expert_gate,
        expert_up=expert_up,
        expert_down=expert_down,
        implementation=implementation,
    )  # [rows, C] in arrival order
    # back: source s's rows (at receive_offsets[s]) to its sorted places (its send offset for me)
    return_offsets = (jnp.cumsum(sent, axis=1) - sent)[:, me]  # i32[N_e]
    returned = exchange(
        outputs,
        _buffer_like((expert.shape[0], x.shape[-1]), outputs),
        receive_offsets,
        receive_sizes,
        return_offsets,
        per_device,
        axis_name=axis_name,
    )  # [A, C] in this shard's sorted order
    weighted = returned * weights.reshape(-1)[order][:, None].astype(returned.dtype)
    return jnp.zeros_like(x).at[token].add(weighted), jnp.int32(0)


def _received_local_experts(rows, receive_offsets, receive_sizes, received_counts):
    """i32[rows]: the local expert of each row a ragged exchange received (source s's rows at
    ``receive_offsets[s]``, sorted by expert as ``received_counts[s]`` [N_e, E_l] counts them);
    E_l for the unused rows past the last source's."""
    axis_size, local = received_counts.shape
    row = jnp.arange(rows, dtype=jnp.int32)
    source = jnp.searchsorted(receive_offsets + receive_sizes, row, side="right").astype(jnp.int32)  # N_e past the end
    clipped = jnp.minimum(source, axis_size - 1)
    ends = jnp.cumsum(received_counts, axis=1)  # [N_e, E_l]
    expert = jax.vmap(lambda r, s: jnp.searchsorted(ends[s], r, side="right"))(row - receive_offsets[clipped], clipped)
    return jnp.where(source < axis_size, expert, local).astype(jnp.int32)


def _buffer_like(shape, rows):
    """Zeros of ``shape`` typed as varying over the axes ``rows`` (the rows sent) vary over.
    ``jax.lax.ragged_all_to_all`` types its result like this buffer: plain zeros are typed as
    equal on every device, though each receives other rows, and the backward would then sum
    the exchange's gradient over the axis (an all-reduce, and wrong gradients)."""
    return vary_over(jnp.zeros(shape, rows.dtype), _varying_axes(rows))


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name):
    """``jax.lax.ragged_all_to_all``'s result computed from an all-gather (any backend;
    N_e times its bytes): device d writes rows ``input_offsets[j] .. + send_sizes[j]`` of
    its operand at ``output_offsets[j]`` of device j's output. ``recv_sizes`` is implied."""
    del recv_sizes
    me = jax.lax.axis_index(axis_name)
    operands = jax.lax.all_gather(operand, axis_name)  # [N_e, R_in, C]
    starts, sizes, targets = (
        jax.lax.all_gather(a, axis_name)[:, me] for a in (input_offsets, send_sizes, output_offsets)
    )
    row = jnp.arange(operand.shape[0])
    inside = (row[None, :] >= starts[:, None]) & (row[None, :] < (starts + sizes)[:, None])  # [N_e, R_in]
    destination = jnp.where(inside, targets[:, None] + row[None, :] - starts[:, None], output.shape[0])
    return output.at[destination.reshape(-1)].set(operands.reshape(-1, operand.shape[-1]), mode="drop")


def replicated_expert_parallel_moe(
    x,
    weights,
    expert_ids,
    *,
    expert_gate,
    expert_up,
    expert_down,
    axis_name,
    axis_size,
    num_experts,
    implementation=None,
):
    """Expert parallelism for tokens every device of the axis holds (a decoding batch
    that does not split over it): each device runs only its own E_l experts'
    assignments, the others weighted 0, and the outputs are summed over the axis (one
    all-reduce of [N, C], no exchange). x [N, C] the same on every device -> [N, C]."""
    check_experts(num_experts, axis_size=axis_size, axis_name=axis_name)
    # Cast once to varying: the backward then sums the devices' partial cotangents. Left
    # to the gather by (varying) sorted order, JAX 0.10 gives each device its own partial
    # d(x) as if it were the whole (gradients off by the other devices' experts).
    x, weights = vary_over(x, axis_name), vary_over(weights, axis_name)
    local = num_experts // axis_size
    first = jax.lax.axis_index(axis_name) * local
    mine = (expert_ids >= first) & (expert_ids < first + local)  # bool[N, k]
    y = sparse_moe(
        x,
        jnp.where(mine, weights, 0.0),
        jnp.clip(expert_ids - first, 0, local - 1),
        expert_gate=expert_gate,
        expert_up=expert_up,
        expert_down=expert_down,
        implementation=implementation,
    )
    return jax.lax.psum(y, axis_name)
