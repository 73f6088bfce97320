"""Model FLOPs utilisation (MFU): the model's FLOPs per step / step time / peak FLOP/s.

MFU = flops_per_step / (step_time_s * num_devices * peak_flops_per_device)

Model FLOPs are those the model's maths needs, counted the same way whatever the
implementation does (MaxText's ``calculate_tflops_training_per_device``; PaLM, Chowdhery
et al. 2022, appendix B): recomputation (rematerialisation), padding and communication
are not counted, so MFU compares runs, layouts and hardware fairly. Peaks are dense
(no sparsity) bf16 tensor-core / MXU FLOP/s per JAX device, in ``PEAK_FLOPS``
(``zoo.measure.hardware``, the hardware table the planner reads too).

Decoder Transformer, per token (letters as in ``zoo.layers.TransformerBlock``: L layers, C model
width, H query heads, K key/value heads, D head_dim, F MLP hidden, m = 3 MLP matrices for
a gated MLP (swiglu, geglu) or 2, V vocabulary, T sequence length)::

    N_matmul = L * (C*H*D + 2*C*K*D + H*D*C + m*C*F) + C*V
               (query, key+value, output projections, MLP, LM head)

    flops_per_token = 6 * N_matmul + 12 * L * T * H * D * (1/2 if causal else 1)

Derivation. A matmul with an (in x out) weight does in*out multiply-adds per token, i.e.
2*in*out FLOPs forward; the backward pass does it twice more (gradient with respect to
the input and with respect to the weight), so training costs 3 * 2 = 6 FLOPs per matmul
weight per token. Attention adds two matmuls whose "weights" are activations: the scores
Q K^T (per head T x D times D x T: 2*T*T*D FLOPs per sequence) and A V (another
2*T*T*D), so 4*T*H*D FLOPs per token per layer forward, 12*T*H*D for training. A causal
mask leaves only the lower triangle to compute: half of it (MaxText halves it; with
H*D = C this is PaLM's 12*L*T*C term, halved). The token-embedding lookup is a gather,
not a matmul, and is not counted; norms, softmax, activations, biases and the optimizer
update are O(C) per token and are left out.
"""

from zoo.config.choices import GATED_MLPS
from zoo.measure.hardware import PEAK_FLOPS, UnknownDeviceError, match_device_kind


def transformer_matmul_params(
    *,
    num_layers,
    hidden_dim,
    num_query_heads,
    head_dim,
    intermediate_dim,
    vocabulary_size=0,
    num_key_value_heads=None,
    gated_mlp=True,
):
    """N_matmul: the weights every token is multiplied by (see the module docstring)."""
    kv_heads = num_query_heads if num_key_value_heads is None else num_key_value_heads
    attention = hidden_dim * head_dim * (2 * num_query_heads + 2 * kv_heads)  # query + output, key + value
    mlp = (3 if gated_mlp else 2) * hidden_dim * intermediate_dim
    return num_layers * (attention + mlp) + hidden_dim * vocabulary_size


def transformer_flops_per_token(
    *,
    num_layers,
    hidden_dim,
    num_query_heads,
    head_dim,
    intermediate_dim,
    sequence_length,
    vocabulary_size=0,
    num_key_value_heads=None,
    gated_mlp=True,
    causal=True,
    training=True,
):
    """Model FLOPs per token: ``6 * N_matmul + 12 * L * T * H * D`` (causal: attention
    halved) for training, ``2 * N_matmul + 4 * L * T * H * D`` forward only.

    ``vocabulary_size`` is the width of a per-token head (an LM head); 0 for none.
    """
    for name, value in (
        ("num_layers", num_layers),
        ("hidden_dim", hidden_dim),
        ("num_query_heads", num_query_heads),
        ("head_dim", head_dim),
        ("sequence_length", sequence_length),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    passes = 3 if training else 1  # forward, plus backward at twice the forward
    weights = transformer_matmul_params(
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_query_heads=num_query_heads,
        head_dim=head_dim,
        intermediate_dim=intermediate_dim,
        vocabulary_size=vocabulary_size,
        num_key_value_heads=num_key_value_heads,
        gated_mlp=gated_mlp,
    )
    attention = 4 * num_layers * sequence_length * num_query_heads * head_dim // (2 if causal else 1)  # even: exact
    return passes * (2 * weights + attention)


def gpt_flops_per_token(config, sequence_length, training=True):
    """``transformer_flops_per_token`` for a ``GPTCausalLM`` or ``GPTBackbone``
    ``get_config()`` or a ``GPT_CONFIGS`` entry (``gpt_configs.backbone_config``): causal,
    with the LM head. A Mixture-of-Experts block counts the weights a token is multiplied
    by (``active_moe_parameters``: the router, its k experts, the shared expert), not all E."""
    from zoo.models.gpt.gpt_configs import (  # zoo.models imports Keras: only when asked
        active_moe_parameters,
        backbone_config,
        dense_mlp_parameters,
        sparse_layer_count,
    )

    config = backbone_config(config)
    head_dim = config.get("head_dim") or config["hidden_dim"] // config["num_query_heads"]
    passes = 3 if training else 1
    sparse = sparse_layer_count(config)
    sparse_extra = passes * 2 * sparse * (active_moe_parameters(config) - dense_mlp_parameters(config)) if sparse else 0
    return sparse_extra + transformer_flops_per_token(
        num_layers=config["num_layers"],
        hidden_dim=config["hidden_dim"],
        num_query_heads=config["num_query_heads"],
        head_dim=head_dim,
        intermediate_dim=config["intermediate_dim"],
        sequence_length=sequence_length,
        vocabulary_size=config["vocabulary_size"],
        num_key_value_heads=config.get("num_key_value_heads"),
        gated_mlp=config.get("mlp", "swiglu") in GATED_MLPS,
        causal=True,
        training=training,
    )


def gpt_lora_flops_per_token(config, sequence_length):
    """Model FLOPs per token of a LoRA step of a GPT (the "4 x parameters" convention): the
    frozen weights' matmuls run forward and back to their inputs (4 x N_matmul, no weight
    gradients), attention forward and backward (3 x its forward FLOPs, causal halved); the
    factors' own FLOPs (r << C) are left out."""
    from zoo.models.gpt.gpt_configs import backbone_config  # zoo.models imports Keras: only when asked

    config = backbone_config(config)
    head_dim = config.get("head_dim") or config["hidden_dim"] // config["num_query_heads"]
    attention = 4 * config["num_layers"] * sequence_length * config["num_query_heads"] * head_dim // 2  # causal
    forward = gpt_flops_per_token(config, sequence_length, training=False)  # 2 * N_matmul + attention
    return 2 * (forward - attention) + 3 * attention  # 4 * N_matmul + 3 * attention


def compiled_flops(function, *args):
    """FLOPs XLA counts for ``jax.jit(function)(*args)`` (its cost analysis).

    For models without a formula here (the CNN, say). These are the compiled program's
    FLOPs, rematerialisation included, so MFU from them is closer to hardware FLOPs
    utilisation; the count is per program, i.e. summed over the devices it runs on.
    """
    import jax

    analysis = jax.jit(function).lower(*args).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
        analysis = analysis[0]
    if not analysis or "flops" not in analysis:
        raise ValueError("XLA gave no FLOP count for this program on this backend")
    return float(analysis["flops"])


def mfu(flops_per_step, step_time_s, num_devices, peak_flops_per_device):
    """Model FLOPs utilisation, a fraction: achieved FLOP/s over the devices' peak."""
    for name, value in (
        ("flops_per_step", flops_per_step),
        ("step_time_s", step_time_s),
        ("num_devices", num_devices),
        ("peak_flops_per_device", peak_flops_per_device),
    ):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    return flops_per_step / step_time_s / (num_devices * peak_flops_per_device)


def peak_flops_for(device_kind):
    """``(name, dense bf16 FLOP/s)`` for a JAX ``device_kind`` such as ``"NVIDIA H200"``.

    Raises:
        UnknownDeviceError: naming the kind, when ``PEAK_FLOPS`` has no entry for it.
    """
    name = match_device_kind(device_kind)
    if name is None:
        raise UnknownDeviceError(
            f"unknown device kind {device_kind!r}; pass --peak-tflops (its dense bf16 TFLOP/s per device) "
            f"or add it to zoo.measure.hardware.PEAK_FLOPS (known: {', '.join(PEAK_FLOPS)})"
        )
    return name, PEAK_FLOPS[name]


def resolve_peak_flops(peak_tflops=None, device_kind=None):
    """Peak FLOP/s per device: ``peak_tflops * 1e12`` when given, else looked up for
    ``device_kind`` (default: ``jax.devices()[0].device_kind``)."""
    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"peak TFLOP/s must be positive, got {peak_tflops!r}")
        return peak_tflops * 1e12
    if device_kind is None:
        import jax

        device_kind = jax.devices()[0].device_kind
    return peak_flops_for(device_kind)[1]
