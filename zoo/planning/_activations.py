"""What a Transformer block keeps for its backward pass, per token, by remat policy: the
one formula the planner's analytic model (``analytic.estimate``) and the remat correction
(``remat_saved_per_block``) share; and, where this JAX's XLA:CPU cannot show remat
(JAX 0.10), the correction a plan applies (``remat_correction``) and what its verdict
then says (``remat_caveat``)."""

from zoo.config.choices import GATED_MLPS, compute_bytes, weight_bytes
from zoo.config.layouts import layout_record, pipelined

__all__ = [
    "remat_caveat",
    "remat_correction",
    "remat_elements_per_token",
    "remat_notes",
    "remat_saved_per_block",
]


def remat_elements_per_token(remat, model, tp_divisor):
    """Activation elements one block keeps per token for the backward pass.

    Calibrated on gpt_1b's compiled block (JAX 0.12, bf16, docs/planning.md): none keeps
    ~16C + 2mF (m = 3 matrices of a gated MLP, else 2); dots_saveable the matmul outputs
    (H*D + 2K*D + m'F + 2C, m' = 2 gated, else 1); full only the block's input (C);
    save_attention q, k, v, the attention's output and log-sum-exp and the input
    (2H*D + 2K*D + 2H + C); offload_attention keeps on the device what full keeps.
    Head and MLP terms are split over the model axis (``tp_divisor``). A Mixture-of-Experts
    model's F is what one token passes through (``_routed_width``)."""
    width, heads = model["hidden_dim"], model["num_query_heads"]
    head_dim = model.get("head_dim") or width // heads
    kv_heads = model.get("num_key_value_heads") or heads
    gated = model["mlp"] in GATED_MLPS
    ffn = _routed_width(model)
    if remat in ("full", "offload_attention"):  # offload: the attention's tensors wait in host memory
        return width
    if remat == "save_attention":  # q, k, v, the kernel's output and log-sum-exp (f32: 2 elements per head)
        return (2 * heads * head_dim + 2 * kv_heads * head_dim + 2 * heads) / tp_divisor + width
    if remat == "dots_saveable":
        return (heads * head_dim + 2 * kv_heads * head_dim + (2 if gated else 1) * ffn) / tp_divisor + 2 * width
    return (12 * width + 2 * (3 if gated else 2) * ffn) / tp_divisor + 4 * width


def _routed_width(model):
    """F per token: the dense MLP's, or for a model whose blocks are all sparse k x the
    experts' width plus the shared expert's (each token's rows in the grouped matmuls)."""
    if not model.get("num_experts") or model.get("moe_layers") is not None:
        return model["intermediate_dim"]
    expert_width = model.get("moe_intermediate_dim") or model["intermediate_dim"]
    return (model.get("num_experts_per_token") or 2) * expert_width + (model.get("shared_expert_dim") or 0)


def remat_caveat(remat, correction):
    """The verdict's qualifier where this JAX's XLA:CPU does not show remat (JAX 0.10)."""
    from zoo.measure.compiled_step import memory_analysis_reflects_remat

    if remat == "none" or memory_analysis_reflects_remat():
        return ""
    if correction:
        return f"estimated, not compiled: this JAX's CPU compile does not show remat={remat!r}; Python 3.12's JAX does"
    return f"an upper bound: this JAX's CPU compile does not show remat={remat!r}; Python 3.12's JAX does"


def remat_saved_per_block(settings, step):
    """Bytes per device one Transformer block keeps for the backward pass under the
    job's remat policy (a GPT job), from the shapes alone
    (``_activations.remat_elements_per_token``: full keeps the block's input; dots_saveable
    the outputs of its matmuls without batch dimensions, JAX's
    ``dots_with_no_batch_dims_saveable``), per token of this device's share of the batch
    and sequence."""
    from zoo.models.gpt.gpt_configs import config_by_name

    sizes, layout = step.axis_sizes, layout_record(settings.layout)
    split = layout.split(sizes, layout.sequence_axis)  # the sequence's split
    batch_split = layout.batch_split(sizes)
    tokens = step.batch_size // batch_split * settings.sequence_length // split
    divisor = layout.split(sizes, layout.model_axis) if layout.heads_split else 1  # heads and MLP split over model
    itemsize = compute_bytes(settings.precision)
    return int(
        tokens * remat_elements_per_token(settings.remat, config_by_name(settings.config_name), divisor) * itemsize
    )


def remat_correction(steps, settings, full_depth, step):
    """Bytes to add to the extrapolated temporaries: every block but one keeps only what
    the policy saves plus what a block holds whatever the policy (its weights' gradients
    and, where the layout splits weights over the data or seq axis, its all-gathered
    weights in the compute dtype); one block's full recomputation stays (the measured
    per-block cost). Checked against JAX 0.12's compiles in docs/planning.md."""
    low, high = steps
    gap = high.num_layers - low.num_layers  # blocks between the two depths (a pattern's period)
    per_block = (high.memory["temp"] - low.memory["temp"]) / gap
    kept = remat_saved_per_block(settings, step) + (high.memory["gradients"] - low.memory["gradients"]) / gap
    layout = layout_record(settings.layout)
    if layout.fsdp_axis is not None:  # the weights gathered over it, block by block
        gathered = layout.split(step.axis_sizes, layout.fsdp_axis)
        itemsize = compute_bytes(settings.precision)
        kept += (
            (high.memory["weights"] - low.memory["weights"])
            / gap
            * gathered
            * itemsize
            / weight_bytes(settings.precision)
        )
    return -int((full_depth - 1) * max(per_block - kept, 0))


def remat_notes(settings, *, corrected):
    """Where this XLA's CPU memory analysis cannot show remat and the plan did not correct
    for it (``corrected``: ``remat_correction`` did), what the peak then is."""
    from zoo.measure.compiled_step import memory_analysis_reflects_remat

    remat, notes = getattr(settings, "remat", "none"), []
    if remat != "none" and pipelined(settings.layout) and not memory_analysis_reflects_remat():
        notes.append(
            f"this XLA's CPU memory analysis does not show remat={remat!r} (JAX 0.10); inside the pipeline's loop "
            "the temporaries are not corrected for it: the peak is an upper bound"
        )
    elif remat != "none" and not corrected and not memory_analysis_reflects_remat():
        notes.append(
            f"this XLA's CPU memory analysis does not show remat={remat!r} (JAX 0.10); compiled whole, the "
            "temporaries are not corrected for it: the peak is an upper bound"
        )
    return notes
