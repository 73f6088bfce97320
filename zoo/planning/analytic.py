"""The planner's analytic model: a candidate layout's peak bytes per device and seconds per
optimizer update from the model's sizes, the mesh and the target's roofline, before anything
is compiled (``zoo plan --auto`` ranks its candidates by it, then compiles the best;
docs/planning.md). Each layout's splits are read from its record (``zoo.config.layouts``)."""

from zoo.config.choices import PLANNED_REMATS, compute_bytes, weight_bytes
from zoo.config.layouts import DATA, layout_record, pipelined
from zoo.distribution.mesh import parse_mesh_spec
from zoo.kernels.moe import capacity
from zoo.planning._activations import remat_elements_per_token
from zoo.planning.plan import target_spec
from zoo.planning.roofline import axes_bandwidth

# hardware / model FLOPs: full remat re-runs the forward; save_attention all of it but the attention
RECOMPUTE = {"none": 1.0, "dots_saveable": 1.1, "save_attention": 1.25, "offload_attention": 1.25, "full": 4 / 3}
REMATS_CHEAPEST_FIRST = sorted(PLANNED_REMATS, key=RECOMPUTE.__getitem__)  # what zoo plan --auto tries


def named_model(request):
    """The named GPT config of ``request``, its depth replaced by ``num_layers`` if set (its
    per-layer pattern with it: ``gpt_configs.at_depth``)."""
    from zoo.models.gpt.gpt_configs import at_depth, config_by_name

    model = config_by_name(request.config["config_name"])
    return at_depth(model, request.config.get("num_layers") or model["num_layers"])


def axis_sizes(mesh):
    return dict(parse_mesh_spec(mesh)) if mesh else {}


def estimate(candidate, request):
    """``(peak bytes per device, seconds per optimizer update)`` by the analytic model."""
    from zoo.measure.mfu import gpt_flops_per_token
    from zoo.models.gpt.gpt_configs import count_parameters

    model, spec, config = named_model(request), target_spec(request), request.config
    if pipelined(candidate.layout):
        return _estimate_pipeline(candidate, request)
    if layout_record(candidate.layout).expert_axis:
        return _estimate_expert(candidate, request)
    sizes = axis_sizes(candidate.mesh)
    data, tp, seq = sizes.get("data", 1), sizes.get("model", 1), sizes.get("seq", 1)
    params, layers, length = count_parameters(model), model["num_layers"], config["sequence_length"]
    itemsize = compute_bytes(config.get("precision"))
    record = layout_record(candidate.layout)
    state_split = record.split(sizes, record.fsdp_axis, record.model_axis)
    state = (
        params * (2 * weight_bytes(config.get("precision")) + 8 + 4 * (candidate.accumulation > 1)) / state_split
    )  # weights, gradients, 2 float32 Adam slots (+ accumulators)
    tokens = candidate.micro_batch // data * length // record.split(sizes, record.sequence_axis)
    divisor = tp if record.heads_split else 1
    per_block = tokens * remat_elements_per_token(candidate.remat, model, divisor) * itemsize
    workspace = 0 if candidate.remat == "none" else tokens * remat_elements_per_token("none", model, divisor) * itemsize
    logits = candidate.micro_batch // data * length // seq * model["vocabulary_size"] // max(tp, 1) * 4 * 3
    peak = state + layers * per_block + workspace + logits
    flops = gpt_flops_per_token({**model}, length) * candidate.micro_batch * length * RECOMPUTE[candidate.remat]
    step = flops / (request.devices * spec.peak_flops) + _communication_s(candidate, request, params, itemsize, tokens)
    return peak, step * candidate.accumulation


def pipeline_figures(candidate, request):
    """``{ticks, useful, sent}`` of a pipeline candidate: the loop's R*M + S - 1 ticks, the
    useful fraction R*M / (R*M + S - 1), and the bytes each device sends over ``stage``
    per fit step (one micro-batch's activations (B/(N_data*M), T, C) per tick, forward and
    backward)."""
    model, config = named_model(request), request.config
    sizes = axis_sizes(candidate.mesh)
    stages, m, r = sizes["stage"], candidate.micro_batches, candidate.repeats
    ticks = r * m + stages - 1
    itemsize = compute_bytes(config.get("precision"))
    micro_bytes = (
        candidate.micro_batch // sizes.get("data", 1) // m * config["sequence_length"] * model["hidden_dim"] * itemsize
    )
    return {"ticks": ticks, "useful": r * m / ticks, "sent": 2 * ticks * micro_bytes}


def _estimate_pipeline(candidate, request):
    """``(peak bytes, seconds per update)`` of a pipeline candidate (module docstring)."""
    from zoo.measure.mfu import gpt_flops_per_token
    from zoo.models.gpt.gpt_configs import count_parameters

    model, spec, config = named_model(request), target_spec(request), request.config
    sizes = axis_sizes(candidate.mesh)
    data, stages = sizes.get("data", 1), sizes["stage"]
    layers, length, m = model["num_layers"], config["sequence_length"], candidate.micro_batches
    itemsize = compute_bytes(config.get("precision"))
    params = count_parameters(model)
    outside = count_parameters({**model, "num_layers": 0})  # embedding, head, final norm: on every stage
    per_device = outside + (params - outside) / stages
    state = per_device * 4 * (4 + (candidate.accumulation > 1))  # weights, gradients, 2 Adam slots (+ accumulators)
    figures = pipeline_figures(candidate, request)
    rows = candidate.micro_batch // data  # per data shard
    micro_tokens = rows // m * length
    # every tick runs (and keeps for the backward pass) L/(S*R) blocks on one micro-batch
    blocks_run = figures["ticks"] * layers // (stages * candidate.repeats)
    per_block = micro_tokens * remat_elements_per_token(candidate.remat, model, 1) * itemsize
    workspace = 0 if candidate.remat == "none" else micro_tokens * remat_elements_per_token("none", model, 1) * itemsize
    buffers = (
        (2 + (candidate.repeats > 1)) * rows * length * model["hidden_dim"] * itemsize
    )  # inputs, outputs (+ returning)
    logits = rows * length * model["vocabulary_size"] * 4 * 3
    peak = state + blocks_run * per_block + workspace + buffers + logits
    flops = gpt_flops_per_token({**model}, length) * candidate.micro_batch * length * RECOMPUTE[candidate.remat]
    compute = (
        flops / (request.devices * spec.peak_flops) / figures["useful"]
    )  # the bubble's ticks idle (or compute zeros)
    axes = list(sizes.items())

    def over(axis, sent):
        n = sizes.get(axis, 1)
        return 0.0 if n == 1 else sent * (n - 1) / n / axes_bandwidth((axis,), axes, spec)

    stage_s = (
        figures["sent"] / axes_bandwidth(("stage",), axes, spec) + 2 * figures["ticks"] * spec.collective_latency_s
    )
    stage_s += over(
        "stage", 2 * 2 * rows * length * model["hidden_dim"] * itemsize
    )  # the outputs' psum, and its transpose
    data_s = over("data", 2 * 4 * per_device)  # all-reduce of this stage's gradients
    return peak, (compute + stage_s + data_s) * candidate.accumulation


def expert_figures(candidate, request):
    """``{expert_params, state, tokens, sent}`` of an expert-layout candidate, per device:
    the experts' parameters and the state bytes (the experts split over ``expert``, and
    over ``data`` under ``fsdp+expert``, their F over ``model`` under ``expert+tp``; the
    rest replicated, FSDP over data, or Megatron over model), the tokens of this device's
    share of the batch (over data x expert), and the all-to-all bytes each device sends
    per fit step: four exchanges per sparse block (dispatch and combine, forward and
    backward), each of Q rows of C to each of the E_p - 1 other devices, Q the kernel's
    capacity (``zoo.kernels.moe.capacity``: capacity_factor x tokens x k / E_p, or
    dropless tokens x min(k, E / E_p)) (docs/moe.md)."""
    from zoo.models.gpt.gpt_configs import count_parameters, sparse_layer_count

    model, config = named_model(request), request.config
    sizes = axis_sizes(candidate.mesh)
    data, e_p, tp = sizes.get("data", 1), sizes["expert"], sizes.get("model", 1)
    width, experts = model["hidden_dim"], model["num_experts"]
    expert_width = model.get("moe_intermediate_dim") or model["intermediate_dim"]
    expert_params = sparse_layer_count(model) * experts * 3 * width * expert_width
    other = count_parameters(model) - expert_params
    layout = layout_record(candidate.layout)
    other_split = layout.split(sizes, layout.fsdp_axis, layout.model_axis)  # the dense weights' split
    expert_split = e_p * tp * layout.split(sizes, layout.fsdp_axis)
    slots = 4 + (candidate.accumulation > 1)  # weights, gradients, 2 Adam slots (+ accumulators), f32
    state = 4 * slots * (expert_params / expert_split + other / other_split)
    tokens = candidate.micro_batch // (data * e_p) * config["sequence_length"]
    itemsize = compute_bytes(config.get("precision"))
    k = model.get("num_experts_per_token") or 2
    rows = capacity(
        tokens,
        num_experts_per_token=k,
        axis_size=e_p,
        experts_per_device=experts // e_p,
        capacity_factor=config.get("capacity_factor"),
    )
    sent = 4 * sparse_layer_count(model) * rows * width * itemsize * (e_p - 1)  # Q rows to each of the E_p - 1 others
    return {"expert_params": expert_params, "other_params": other, "state": state, "tokens": tokens, "sent": sent}


def _estimate_expert(candidate, request):
    """``(peak bytes, seconds per update)`` of an expert-layout candidate (``expert_figures``)."""
    from zoo.measure.mfu import gpt_flops_per_token

    model, spec, config = named_model(request), target_spec(request), request.config
    sizes = axis_sizes(candidate.mesh)
    figures = expert_figures(candidate, request)
    tp, length, tokens = sizes.get("model", 1), config["sequence_length"], figures["tokens"]
    itemsize = compute_bytes(config.get("precision"))
    per_block = tokens * remat_elements_per_token(candidate.remat, model, tp) * itemsize
    workspace = 0 if candidate.remat == "none" else tokens * remat_elements_per_token("none", model, tp) * itemsize
    logits = tokens * model["vocabulary_size"] // tp * 4 * 3
    peak = figures["state"] + model["num_layers"] * per_block + workspace + logits
    flops = gpt_flops_per_token({**model}, length) * candidate.micro_batch * length * RECOMPUTE[candidate.remat]
    axes = list(sizes.items())

    def over(axis, sent):
        n = sizes.get(axis, 1)
        return 0.0 if n == 1 else sent * (n - 1) / n / axes_bandwidth((axis,), axes, spec)

    exchange = 0.0 if sizes["expert"] == 1 else figures["sent"] / axes_bandwidth(("expert",), axes, spec)
    layout = layout_record(candidate.layout)
    other = figures["other_params"] / layout.split(sizes, layout.model_axis)  # the dense weights on one device
    # FSDP over data: all-gathered twice and reduce-scattered once; else all-reduced (2 passes)
    gradients = over("data", (3 if layout.fsdp_axis else 2) * 4 * other) + over("expert", 2 * 4 * other)
    return peak, (flops / (request.devices * spec.peak_flops) + exchange + gradients) * candidate.accumulation


def _communication_s(candidate, request, params, itemsize, tokens):
    """Seconds of collectives per fit step, by layout (per device, ring algorithms)."""
    model, spec = named_model(request), target_spec(request)
    sizes = axis_sizes(candidate.mesh)
    axes = [(name, size) for name, size in sizes.items()]
    time = 0.0

    def over(axis, sent):
        n = sizes.get(axis, 1)
        return 0.0 if n == 1 else sent * (n - 1) / n / axes_bandwidth((axis,), axes, spec)

    s, record = candidate.layout, layout_record(candidate.layout)
    shard = params * 4 / record.split(sizes, record.model_axis)
    if record.gradients_all_reduced:
        time += over("data", 2 * 4 * params / sizes.get("model", 1))  # all-reduce of the gradients
    if record.fsdp_axis == DATA:
        time += over("data", 3 * shard)  # all-gather forward and backward, reduce-scatter the gradients
    if record.model_axis:
        activation = (
            candidate.micro_batch
            // sizes.get("data", 1)
            * request.config["sequence_length"]
            * model["hidden_dim"]
            * itemsize
        )
        time += over("model", (4 * model["num_layers"] + 2) * 2 * activation)  # Megatron: 4 all-reduces per block
    if s == "context":
        kv = (
            tokens
            * 2
            * (model.get("num_key_value_heads") or model["num_query_heads"])
            * (model["hidden_dim"] // model["num_query_heads"])
            * itemsize
        )
        time += over("seq", 3 * model["num_layers"] * kv * sizes["seq"]) + over(
            "seq", 3 * params * 4
        )  # ring hops, FSDP over seq
    return time
