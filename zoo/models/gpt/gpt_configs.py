"""Named GPT sizes: ``GPTCausalLM.from_config_name(name, **overrides)`` builds one.

Every entry is a complete set of ``GPTBackbone`` arguments (the causal LM adds no
size of its own); a comment says where each size comes from. ``gpt_tiny`` and
``gpt_small`` are byte-level (``zoo.data.ByteTokenizer``, vocabulary 256, pad id 0) and
train on a CPU; the larger ones size real runs.
"""

from zoo.config.choices import GATED_MLPS
from zoo.config.renamed import MODEL_KEYS, renamed_keys
from zoo.models.gpt._hf_config import backbone_arguments
from zoo.models.gpt._hf_keys import is_hf_config

# what every Gemma 2 / Gemma 3 config shares (see the gemma entries of GPT_CONFIGS)
_GEMMA = {
    "head_dim": 256,
    "mlp": "geglu_tanh",
    "norm": "rms_offset",
    "layer_norm_epsilon": 1e-6,
    "post_norms": True,
    "scale_embeddings": True,
    "attention_scale": 256**-0.5,  # query_pre_attn_scalar 256
    "tie_word_embeddings": True,
}
GPT_CONFIGS = {
    # Unit tests and docs: trains on a CPU in seconds. GQA (2 KV heads for 4 query heads).
    "gpt_tiny": {
        "vocabulary_size": 256,  # bytes
        "num_layers": 2,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 32,  # C
        "intermediate_dim": 64,  # F
        "mlp": "swiglu",
        "norm": "rms",
        "max_sequence_length": 128,
        "tie_word_embeddings": False,
    },
    # Byte-level model for CPU/single-GPU experiments on the embedded text data set.
    "gpt_small": {
        "vocabulary_size": 256,
        "num_layers": 4,
        "num_query_heads": 8,
        "num_key_value_heads": 4,
        "hidden_dim": 256,
        "intermediate_dim": 768,
        "mlp": "swiglu",
        "norm": "rms",
        "max_sequence_length": 512,
        "tie_word_embeddings": False,
    },
    # GPT-2 small (124M) shape: LayerNorm, GELU MLP (tanh-approximate: GPT-2's gelu_new),
    # tied embeddings; rotary instead of learned positions; vocabulary 50304 = GPT-2's
    # 50257 padded to a multiple of 128.
    "gpt_125m": {
        "vocabulary_size": 50304,
        "num_layers": 12,
        "num_query_heads": 12,
        "num_key_value_heads": 12,
        "hidden_dim": 768,
        "intermediate_dim": 3072,
        "mlp": "gelu_tanh",
        "norm": "layer",
        "max_sequence_length": 1024,
        "tie_word_embeddings": True,
    },
    # GPT-2 medium (350M) shape, same conventions as gpt_125m.
    "gpt_350m": {
        "vocabulary_size": 50304,
        "num_layers": 24,
        "num_query_heads": 16,
        "num_key_value_heads": 16,
        "hidden_dim": 1024,
        "intermediate_dim": 4096,
        "mlp": "gelu_tanh",
        "norm": "layer",
        "max_sequence_length": 1024,
        "tie_word_embeddings": True,
    },
    # TinyLlama-1.1B shape: RMSNorm, SwiGLU, GQA 32/4, untied head, LLaMA vocabulary.
    "gpt_1b": {
        "vocabulary_size": 32000,
        "num_layers": 22,
        "num_query_heads": 32,
        "num_key_value_heads": 4,
        "hidden_dim": 2048,
        "intermediate_dim": 5632,
        "mlp": "swiglu",
        "norm": "rms",
        "max_sequence_length": 2048,
        "tie_word_embeddings": False,
    },
    # Llama-3.2-1B's config.json (1.24B parameters, tied): GQA 32/8, RoPE 500,000 with Llama 3
    # scaling; the real shape the long-context, loading, pipeline and LM-head benchmarks size.
    "llama_3_2_1b": {
        "vocabulary_size": 128256,
        "num_layers": 16,
        "num_query_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_dim": 2048,
        "intermediate_dim": 8192,
        "mlp": "swiglu",
        "norm": "rms",
        "layer_norm_epsilon": 1e-5,
        "max_sequence_length": 131072,  # max_position_embeddings
        "rope_max_wavelength": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
    },
    # Mixture-of-Experts (docs/moe.md). Unit tests and docs: gpt_tiny with 4 SwiGLU experts
    # of width 32, top 2 (renormalised, as Mixtral), one shared expert of width 32.
    "gpt_tiny_moe": {
        "vocabulary_size": 256,
        "num_layers": 2,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 32,
        "intermediate_dim": 64,  # the dense MLP's width (blocks outside moe_layers)
        "mlp": "swiglu",
        "norm": "rms",
        "max_sequence_length": 128,
        "tie_word_embeddings": False,
        "num_experts": 4,  # E
        "num_experts_per_token": 2,  # k
        "moe_intermediate_dim": 32,  # F of each expert
        "shared_expert_dim": 32,
        "normalize_router_weights": True,
    },
    # Mixtral-8x7B-v0.1's config.json (46.7B parameters, 12.9B active): 32 layers, 8 experts
    # of width 14336, top 2 renormalised, GQA 32/8, rope_theta 1e6, untied 32000 vocabulary.
    "mixtral_8x7b": {
        "vocabulary_size": 32000,
        "num_layers": 32,
        "num_query_heads": 32,
        "num_key_value_heads": 8,
        "hidden_dim": 4096,
        "intermediate_dim": 14336,
        "mlp": "swiglu",
        "norm": "rms",
        "layer_norm_epsilon": 1e-5,
        "max_sequence_length": 32768,
        "rope_max_wavelength": 1e6,
        "tie_word_embeddings": False,
        "num_experts": 8,
        "num_experts_per_token": 2,
        "moe_intermediate_dim": 14336,
        "normalize_router_weights": True,
        "router_aux_loss_coefficient": 0.02,
    },
    # Qwen1.5-MoE-A2.7B's config.json (14.3B parameters, 2.7B active): 24 layers, 60 experts
    # of width 1408, top 4 not renormalised (norm_topk_prob false), a shared expert of
    # width 5632 behind a sigmoid gate, q/k/v biases, MHA 16 heads, 151936 vocabulary.
    # The zoo needs E divisible by the expert axis: 60 splits over 2, 3, 4, 5, 6, 10, 12, ...
    "qwen2_moe_a2.7b": {
        "vocabulary_size": 151936,
        "num_layers": 24,
        "num_query_heads": 16,
        "num_key_value_heads": 16,
        "hidden_dim": 2048,
        "intermediate_dim": 5632,
        "mlp": "swiglu",
        "norm": "rms",
        "layer_norm_epsilon": 1e-6,
        "max_sequence_length": 8192,
        "rope_max_wavelength": 1e6,
        "qkv_bias": True,
        "tie_word_embeddings": False,
        "num_experts": 60,
        "num_experts_per_token": 4,
        "moe_intermediate_dim": 1408,
        "shared_expert_dim": 5632,
        "normalize_router_weights": False,
        "router_aux_loss_coefficient": 0.001,
    },
    # Qwen3 (model_type qwen3 / qwen3_moe): qk-norm (RMSNorm over D of each query and key
    # head before RoPE), no biases, head_dim 128 whatever C / H is, rope_theta 1e6,
    # 40960 positions, 151936 vocabulary. For compile-only sizing (zoo plan): the weights
    # load from a Qwen3 folder with GPTCausalLM.from_preset(folder).
    # Qwen3-0.6B's config.json (0.596B parameters, embeddings included): tied, GQA 16/8.
    "qwen3_0.6b": {
        "vocabulary_size": 151936,
        "num_layers": 28,
        "num_query_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,  # 16 x 128 = 2048 > hidden 1024
        "hidden_dim": 1024,
        "intermediate_dim": 3072,
        "mlp": "swiglu",
        "norm": "rms",
        "layer_norm_epsilon": 1e-6,
        "max_sequence_length": 40960,
        "rope_max_wavelength": 1e6,
        "qk_norm": True,
        "tie_word_embeddings": True,
    },
    # Qwen3-8B's config.json (8.19B parameters): untied, GQA 32/8.
    "qwen3_8b": {
        "vocabulary_size": 151936,
        "num_layers": 36,
        "num_query_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_dim": 4096,
        "intermediate_dim": 12288,
        "mlp": "swiglu",
        "norm": "rms",
        "layer_norm_epsilon": 1e-6,
        "max_sequence_length": 40960,
        "rope_max_wavelength": 1e6,
        "qk_norm": True,
        "tie_word_embeddings": False,
    },
    # Qwen3-30B-A3B's config.json (30.5B parameters, 3.3B active): 48 layers, every block
    # sparse, 128 experts of width 768, top 8 renormalised (norm_topk_prob true), no shared
    # expert, GQA 32/4, untied.
    "qwen3_30b_a3b": {
        "vocabulary_size": 151936,
        "num_layers": 48,
        "num_query_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_dim": 2048,
        "intermediate_dim": 6144,  # intermediate_size: a dense block's width (none here: mlp_only_layers [])
        "mlp": "swiglu",
        "norm": "rms",
        "layer_norm_epsilon": 1e-6,
        "max_sequence_length": 40960,
        "rope_max_wavelength": 1e6,
        "qk_norm": True,
        "tie_word_embeddings": False,
        "num_experts": 128,
        "num_experts_per_token": 8,
        "moe_intermediate_dim": 768,
        "normalize_router_weights": True,
        "router_aux_loss_coefficient": 0.001,
    },
    # Gemma 2 / Gemma 3 text (model_type gemma2 / gemma3_text): RMSNorm times (1 + weight), a
    # norm before and after each sublayer, GeGLU with tanh GELU, embeddings times sqrt(C),
    # head_dim 256, attention scale query_pre_attn_scalar ** -0.5 (256 here), tied. For
    # compile-only sizing (zoo plan); the weights load from a Gemma folder with
    # GPTCausalLM.from_preset(folder).
    # Gemma-2-2B's config.json (2,614,341,888 parameters): GQA 8/4, soft-caps 50 (attention
    # scores) and 30 (final logits), a 4096 window on the even layers, 8192 positions.
    "gemma2_2b": {
        **_GEMMA,
        "vocabulary_size": 256000,
        "num_layers": 26,
        "num_query_heads": 8,
        "num_key_value_heads": 4,
        "hidden_dim": 2304,
        "intermediate_dim": 9216,
        "max_sequence_length": 8192,
        "rope_max_wavelength": 10000.0,
        "attention_logit_softcap": 50.0,
        "final_logit_softcap": 30.0,
        "sliding_window": 4096,
        "sliding_window_layers": [i for i in range(26) if (i + 1) % 2],
    },
    # Gemma-3-1B-pt's config.json (999,885,952 parameters): qk-norm, MQA 4/1, a 512 window on
    # 5 of every 6 layers ((i + 1) % 6 != 0) with RoPE base 1e4 there, 1e6 on the global ones.
    "gemma3_1b": {
        **_GEMMA,
        "vocabulary_size": 262144,
        "num_layers": 26,
        "num_query_heads": 4,
        "num_key_value_heads": 1,
        "hidden_dim": 1152,
        "intermediate_dim": 6912,
        "max_sequence_length": 32768,
        "rope_max_wavelength": 1e6,
        "local_rope_max_wavelength": 10000.0,
        "qk_norm": True,
        "sliding_window": 512,
        "sliding_window_layers": [i for i in range(26) if (i + 1) % 6],
    },
    # Gemma-3-4B's text model (3,880,263,168 parameters counted here; the published checkpoint adds the
    # vision tower): GQA 8/4, a 1024 window on 5 of every 6 layers. Its global layers' RoPE is
    # scaled linearly by 8 (rope_scaling), which the zoo does not compute: sizing only, and
    # its config.json is refused naming rope_scaling.
    "gemma3_4b": {
        **_GEMMA,
        "vocabulary_size": 262208,
        "num_layers": 34,
        "num_query_heads": 8,
        "num_key_value_heads": 4,
        "hidden_dim": 2560,
        "intermediate_dim": 10240,
        "max_sequence_length": 131072,
        "rope_max_wavelength": 1e6,
        "local_rope_max_wavelength": 10000.0,
        "qk_norm": True,
        "sliding_window": 1024,
        "sliding_window_layers": [i for i in range(34) if (i + 1) % 6],
    },
}


def config_by_name(name):
    """A copy of ``GPT_CONFIGS[name]``; an unknown name raises listing the known ones."""
    if name not in GPT_CONFIGS:
        raise ValueError(f"unknown GPT config name {name!r}; available: {sorted(GPT_CONFIGS)}")
    return dict(GPT_CONFIGS[name])


# Lists of block indices: a config's per-layer pattern (which blocks are windowed, Gemma's
# local/global alternation and its local RoPE base with them; which blocks are sparse).
PER_LAYER_KEYS = ("sliding_window_layers", "moe_layers")
_PATTERN_SWITCHES = {"sliding_window_layers": "sliding_window", "moe_layers": "num_experts"}  # off: None / 0


def layer_period(config):
    """P: the smallest period of ``config``'s per-layer pattern (``PER_LAYER_KEYS``): every
    block i < L is like block i mod P (1 for a uniform model; Gemma 2: 2, Gemma 3: 6);
    None when no P <= L / 2 fits (no period repeats, e.g. Qwen2's last layers windowed)."""
    layers = config["num_layers"]
    patterns = [set(config[key]) for key in PER_LAYER_KEYS if config.get(key) is not None]
    patterns = [pattern for pattern in patterns if not pattern >= set(range(layers))]  # every block: uniform
    for period in range(1, max(layers // 2, 1) + 1):
        if all((i in pattern) == (i % period in pattern) for pattern in patterns for i in range(layers)):
            return period
    return None


def at_depth(config, num_layers):
    """``config`` with ``num_layers`` blocks, its per-layer pattern kept: a periodic one
    (``layer_period``) tiled, block i as block i mod P (Gemma 3 at 12 blocks: two 5:1
    periods); another trimmed to the blocks kept (blocks added past L take no list), a
    list left empty turning its feature off (``sliding_window`` None, ``num_experts`` 0)."""
    period = layer_period(config)
    config = {**config, "num_layers": num_layers}
    for key in PER_LAYER_KEYS:
        if config.get(key) is None:
            continue
        pattern = set(config[key])
        kept = [i for i in range(num_layers) if (i % period if period else i) in pattern]
        if not kept:
            config.update({key: None, _PATTERN_SWITCHES[key]: None if key == "sliding_window_layers" else 0})
        else:
            config[key] = None if len(kept) == num_layers else kept
    return config


def depth_overrides(name, num_layers, overrides=None):
    """The entries of ``GPT_CONFIGS[name]`` to replace for a depth of ``num_layers``:
    ``num_layers`` and the per-layer pattern that goes with it (``at_depth``), less what
    ``overrides`` already sets (an explicit pattern wins)."""
    config = config_by_name(name)
    changed = {key: value for key, value in at_depth(config, num_layers).items() if config.get(key, value) != value}
    changed["num_layers"] = num_layers
    return {key: value for key, value in changed.items() if key not in (overrides or {})}


def with_depth_pattern(name, overrides):
    """``overrides`` of the named config ``name``, plus, when they set ``num_layers``, the
    per-layer pattern that goes with that depth (``depth_overrides``; a pattern they set
    themselves wins). What ``GPTBackbone.named_config`` and ``GPTCausalLM.named_config`` build."""
    if "num_layers" not in overrides or name not in GPT_CONFIGS:
        return overrides
    return {**depth_overrides(name, overrides["num_layers"], overrides), **overrides}


def backbone_config(config):
    """The ``GPTBackbone`` arguments in ``config``, old keys renamed (``zoo.config.renamed``).

    ``config``: a ``GPT_CONFIGS`` entry or ``GPTBackbone.get_config()``; a
    ``GPTCausalLM.get_config()`` (its ``backbone`` nested as Keras serialises it); a
    serialised model (``{"class_name": ..., "config": ...}``, as in a preset's config.json);
    or a Hugging Face ``config.json`` (``model_type`` llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe), mapped and
    checked by ``_hf_config.backbone_arguments``.
    """
    if is_hf_config(config):
        return backbone_arguments(config)
    if "class_name" in config and isinstance(config.get("config"), dict):
        config = config["config"]
    if isinstance(config.get("backbone"), dict):
        config = config["backbone"].get("config", config["backbone"])
    return renamed_keys(config, MODEL_KEYS)


def count_parameters(config):
    """Trainable parameters of the ``GPTCausalLM`` of ``config`` (see ``backbone_config``).

    V vocabulary, C hidden, H/K heads/KV heads, D head_dim, F intermediate, L layers.
    """
    config = backbone_config(config)
    vocab, width, layers = config["vocabulary_size"], config["hidden_dim"], config["num_layers"]
    heads = config["num_query_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or width // heads
    norm = (2 if config.get("norm", "rms") == "layer" else 1) * width  # LayerNorm: gamma and beta
    attention = width * head_dim * (2 * heads + 2 * kv_heads)  # query, output (H); key, value (K)
    mlp = dense_mlp_parameters(config)
    head = 0 if config.get("tie_word_embeddings", False) else width * vocab
    biases = (heads + 2 * kv_heads) * head_dim if config.get("qkv_bias") else 0
    qk_norms = 2 * head_dim if config.get("qk_norm") else 0  # one (D,) scale for the queries, one for the keys
    sparse = sparse_layer_count(config)
    moe = moe_parameters(config) if sparse else 0
    block_norms = 4 if config.get("post_norms") else 2  # Gemma: a norm before and after each sublayer
    per_layer = attention + biases + qk_norms + block_norms * norm
    return vocab * width + layers * per_layer + (layers - sparse) * mlp + sparse * moe + norm + head


def dense_mlp_parameters(config):
    """One dense MLP's weights: (2 or 3) x C x F."""
    return (3 if config.get("mlp", "swiglu") in GATED_MLPS else 2) * config["hidden_dim"] * config["intermediate_dim"]


def sparse_layer_count(config):
    """How many blocks are Mixture-of-Experts blocks."""
    if not config.get("num_experts"):
        return 0
    moe_layers = config.get("moe_layers")
    return config["num_layers"] if moe_layers is None else len(moe_layers)


def _moe_widths(config):
    """(E, k, F of each expert, F of the shared expert or 0)."""
    expert_width = config.get("moe_intermediate_dim") or config["intermediate_dim"]
    return (
        config["num_experts"],
        config.get("num_experts_per_token") or 2,
        expert_width,
        config.get("shared_expert_dim") or 0,
    )


def moe_parameters(config):
    """One MoE feed-forward's parameters: router (C, E), E SwiGLU experts, the shared
    expert and its gate (C, 1)."""
    width, (experts, _, expert_width, shared) = config["hidden_dim"], _moe_widths(config)
    return width * experts + experts * 3 * width * expert_width + (3 * width * shared + width if shared else 0)


def active_moe_parameters(config):
    """The weights of one MoE feed-forward a token is multiplied by: the router, k of
    the E experts, the shared expert and its gate."""
    width, (experts, k, expert_width, shared) = config["hidden_dim"], _moe_widths(config)
    return width * experts + k * 3 * width * expert_width + (3 * width * shared + width if shared else 0)
