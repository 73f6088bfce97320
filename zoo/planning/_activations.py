"""What a Transformer block keeps for its backward pass, per token, by remat policy: the
one formula the planner's analytic model (``search.estimate``) and the remat correction
(``plan.remat_saved_per_block``) share."""

from zoo.config.choices import GATED_MLPS

__all__ = ["remat_elements_per_token"]


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
