"""Hugging Face ``config.json`` <-> ``GPTBackbone`` arguments, for Llama-family models.

Supported ``model_type``s (``zoo.config.choices.HF_MODEL_TYPES``): ``llama`` (Llama 1-3.2,
TinyLlama, ...), ``mistral`` (its ``sliding_window`` in every layer), ``qwen2`` (biases on
q/k/v; a window from layer ``max_window_layers`` on with ``use_sliding_window``),
``qwen3`` (no biases, qk-norm: ``GPTBackbone(qk_norm=True)``, an explicit ``head_dim``,
default 128; its window keys read as qwen2's), and the Mixture-of-Experts ``mixtral``
(every block sparse, top-k renormalised), ``qwen2_moe`` (a sigmoid-gated shared expert,
top-k as ``norm_topk_prob`` says, dense blocks where ``decoder_sparse_step`` /
``mlp_only_layers`` put them) and ``qwen3_moe`` (Qwen2-MoE's routing and sparse pattern
without the shared expert or biases, with qk-norm; ``use_sliding_window`` windows every
layer, as transformers 4.57 computes it, which reads no ``max_window_layers`` for it). They
are the zoo GPT exactly: RMSNorm, SwiGLU MLP or SwiGLU experts, grouped-query attention,
rotate-half RoPE (with Llama 3's ``rope_scaling``), tied or untied head.

Every key of the file is either mapped, or known to change nothing the zoo computes
(token ids, dtype, bookkeeping, training-only switches), or read together with others
(``sliding_window``, ``use_sliding_window``, ``max_window_layers``, ``layer_types``:
``_window_arguments``), or refused: a key or value that would change the numbers the zoo
cannot reproduce (another ``rope_scaling``, a Llama with a window, biases the zoo has no
weights for, such as ``attention_bias`` true (Llama's and Qwen3's four, the output's
included), a Qwen2-MoE shared-expert key in a ``qwen3_moe``, quantization, another
activation) raises ``UnsupportedCheckpoint`` naming
it and its value, before anything is built. A number out of range (a size that is not a
positive integer, heads that do not divide, ``rope_theta`` or ``rms_norm_eps`` not finite
and positive) is a damaged file rather than another model: ``CheckpointError``, naming
the key and its value.

Both forms of the file load: transformers 4's, and transformers 5's, which writes RoPE as one
key, ``rope_parameters`` (``{"rope_type": "default" | "llama3", "rope_theta": ..., and Llama
3's factors}``; Gemma 3's nested by layer type, ``{"full_attention": {...},
"sliding_attention": {...}}``, in place of ``rope_theta``, ``rope_scaling`` and
``rope_local_base_freq``) and Qwen3-MoE's expert count as ``num_local_experts``:
``transformers4_keys`` turns it into transformers 4's keys before anything else is read.
Written files (``hf_config``) have transformers 4's keys, every value of the type
transformers declares for its key (``WRITTEN_TYPES``: transformers 5 refuses ``16.0`` where
it declares an int, ``1`` where a float), so both versions load them.
"""

from zoo.config.choices import HF_MODEL_TYPES
from zoo.models.gpt import _hf_gemma
from zoo.models.gpt._hf_keys import (
    ALLOWED_VALUES,
    DEFAULTS,
    DENSE_TWINS,
    EVERY_LAYER_WINDOW_TYPES,
    IGNORED,
    LAYER_TYPES,
    LAYER_TYPES_READERS,
    MAPPED,
    MOE_ALLOWED_VALUES,
    MOE_DEFAULTS,
    MOE_KEYS,
    MOE_TYPES,
    QK_NORM_TYPES,
    QKV_BIAS_TYPES,
    QWEN_MAX_WINDOW_LAYERS,
    QWEN_TYPES,
    SLIDING_WINDOW_KEYS,
    TYPE_DEFAULTS,
    WINDOW_DEFAULTS,
    WINDOW_TYPES,
    UnsupportedCheckpoint,
    check_numbers,
    positive_int,
    transformers4_keys,
)
from zoo.presets.safetensors_weights import CheckpointError

# --- config.json -> GPTBackbone ---------------------------------------------------------


def backbone_arguments(config, where="config.json"):
    """``GPTBackbone`` arguments for a Hugging Face ``config`` (a dict), or
    ``UnsupportedCheckpoint`` naming the first key the zoo cannot reproduce."""
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise UnsupportedCheckpoint(
            f"{where}: model_type {model_type!r} is not supported; the zoo GPT loads {list(HF_MODEL_TYPES)} "
            f"(docs/checkpoints-hf.md says why others are refused)"
        )
    config = transformers4_keys(config, where)
    if model_type in ("gemma2", "gemma3_text"):  # their own keys: _hf_gemma
        return _hf_gemma.backbone_arguments(config, where)
    _check_keys(config, where)
    config = {**TYPE_DEFAULTS.get(model_type, {}), **config}
    check_numbers(config, where)
    window = _window_arguments(config, where)
    arguments = {MAPPED[key]: config[key] for key in MAPPED if config.get(key) is not None}
    for key, value in DEFAULTS.items():
        arguments.setdefault(MAPPED[key], value)
    arguments.update(
        mlp="swiglu", norm="rms", qkv_bias=model_type in QKV_BIAS_TYPES, qk_norm=model_type in QK_NORM_TYPES, **window
    )
    if model_type in MOE_TYPES:
        arguments.update(_moe_arguments({**MOE_DEFAULTS[model_type], **config}, where))
    return arguments


def _check_keys(config, where):
    moe_keys = MOE_KEYS.get(config.get("model_type"), set())
    allowed = {**ALLOWED_VALUES, **{key: values for key, values in MOE_ALLOWED_VALUES.items() if key in moe_keys}}
    for key, value in config.items():
        if key in allowed and value not in allowed[key]:
            raise UnsupportedCheckpoint(
                f"{where}: {key} = {value!r} is not supported (the zoo GPT computes {key} = {allowed[key][0]!r})"
            )
        if (
            key == "layer_types"
            and config.get("model_type") not in LAYER_TYPES_READERS
            and any(kind != "full_attention" for kind in value)
        ):
            raise UnsupportedCheckpoint(
                f"{where}: layer_types {sorted(set(value))} is not supported for model_type {config.get('model_type')!r} "
                f"(transformers reads it for {' and '.join(LAYER_TYPES_READERS)} only): full attention only"
            )
        if (
            key not in MAPPED
            and key not in IGNORED
            and key not in allowed
            and key not in SLIDING_WINDOW_KEYS
            and key not in moe_keys
        ):
            raise UnsupportedCheckpoint(
                f"{where}: key {key!r} (= {value!r}) is not one the zoo GPT knows for model_type "
                f"{config.get('model_type')!r}; it may change the model (mixture-of-experts, quantization, another "
                f"attention), so it is refused"
            )
    scaling = config.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind != "llama3":
            raise UnsupportedCheckpoint(f"{where}: rope_scaling {scaling!r} is not supported: only rope_type 'llama3'")


def _window_arguments(config, where):
    """``{"sliding_window": W, "sliding_window_layers": ...}`` as transformers reads the
    window keys (``{}``: no layer slides); refuses a window the zoo cannot reproduce.

    Mistral, Mixtral: ``sliding_window`` (absent: transformers' default, Mistral's 4096;
    null: none) in every layer. Qwen2, Qwen2-MoE, Qwen3: the window (absent: 4096) only
    with ``use_sliding_window`` true, in the layers i >= ``max_window_layers`` (absent:
    28), or for Qwen2 and Qwen3 the layers their ``layer_types`` names
    ``"sliding_attention"``; Qwen3-MoE: in every layer (``max_window_layers`` is not read).
    Published Qwen configs carry a window or ``max_window_layers`` with
    ``use_sliding_window: false``, which is full attention. Llama: any window, or
    ``use_sliding_window`` true, is refused.
    """
    model_type = config.get("model_type")
    use = config.get("use_sliding_window", False)
    if model_type in LAYER_TYPES_READERS:
        _check_layer_types(config, where)
    if model_type not in QWEN_TYPES and use:
        raise UnsupportedCheckpoint(
            f"{where}: use_sliding_window = {use!r} is not supported for model_type {model_type!r} (a Qwen2 key)"
        )
    window = config.get("sliding_window", WINDOW_DEFAULTS.get(model_type))
    if model_type in QWEN_TYPES and not use:
        window = None  # Qwen2Config nulls the window unless use_sliding_window
    if window is None:
        return {}
    if model_type not in WINDOW_TYPES + QWEN_TYPES:
        raise UnsupportedCheckpoint(
            f"{where}: sliding_window = {window!r} is not supported for model_type {model_type!r}: transformers' "
            f"Llama has no window (a windowed model is model_type 'mistral'; sliding_window null is full attention)"
        )
    positive_int({"sliding_window": window}, "sliding_window", where)
    every = model_type not in QWEN_TYPES or model_type in EVERY_LAYER_WINDOW_TYPES
    layers = list(range(config["num_hidden_layers"])) if every else _windowed_layers(config, where)
    if not layers:
        return {}
    return {
        "sliding_window": window,
        "sliding_window_layers": None if len(layers) == config["num_hidden_layers"] else layers,
    }


def _check_layer_types(config, where):
    """A Qwen2 / Qwen3 ``layer_types`` (null or absent: none) lists a known kind per layer."""
    layer_types, layers = config.get("layer_types"), config["num_hidden_layers"]
    if layer_types is None:
        return
    if (
        not isinstance(layer_types, list)
        or len(layer_types) != layers
        or any(t not in LAYER_TYPES for t in layer_types)
    ):
        raise UnsupportedCheckpoint(
            f"{where}: layer_types = {layer_types!r} must list one of {list(LAYER_TYPES)} per layer ({layers})"
        )


def _windowed_layers(config, where):
    """The indices of a Qwen2 / Qwen2-MoE / Qwen3 config's windowed layers (use_sliding_window true)."""
    layers = config["num_hidden_layers"]  # checked by check_numbers
    layer_types = config.get("layer_types") if config["model_type"] in LAYER_TYPES_READERS else None
    if layer_types is not None:  # checked by _check_layer_types
        return [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    first = config.get("max_window_layers", QWEN_MAX_WINDOW_LAYERS)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise CheckpointError(f"{where}: max_window_layers = {first!r} must be an integer >= 0")
    if config["model_type"] == "qwen2_moe" and 0 < first < layers:
        raise UnsupportedCheckpoint(
            f"{where}: qwen2_moe with use_sliding_window true and max_window_layers = {first} of {layers} layers is "
            f"ambiguous: transformers 4.57's eager and SDPA paths window every layer, its flash-attention path only "
            f"layers {first}..{layers - 1}; refused rather than matching one of them"
        )
    return list(range(first, layers))


def _moe_arguments(config, where):
    """The MoE ``GPTBackbone`` arguments of a ``mixtral`` / ``qwen2_moe`` / ``qwen3_moe``
    config (its defaults filled in): dropless (``capacity_factor`` None), so the logits are exact."""
    if (
        config["model_type"] == "mixtral"
    ):  # intermediate_size is each expert's; MixtralSparseMoeBlock always renormalises
        return dict(
            num_experts=config["num_local_experts"],
            num_experts_per_token=config["num_experts_per_tok"],
            moe_intermediate_dim=config["intermediate_size"],
            shared_expert_dim=0,
            normalize_router_weights=True,
            router_aux_loss_coefficient=config["router_aux_loss_coef"],
            capacity_factor=None,
        )
    if config["model_type"] == "qwen3_moe":  # Qwen3MoeSparseMoeBlock: Qwen2-MoE's routing, no shared expert
        return dict(
            num_experts=config["num_experts"],
            num_experts_per_token=config["num_experts_per_tok"],
            moe_intermediate_dim=config["moe_intermediate_size"],
            shared_expert_dim=0,
            normalize_router_weights=bool(config["norm_topk_prob"]),
            router_aux_loss_coefficient=config["router_aux_loss_coef"],
            moe_layers=_qwen_moe_layers(config, where),
            capacity_factor=None,
        )
    shared = config["shared_expert_intermediate_size"]
    if not isinstance(shared, int) or shared < 1:
        raise UnsupportedCheckpoint(
            f"{where}: shared_expert_intermediate_size = {shared!r}: the zoo maps qwen2_moe's shared expert onto "
            f"shared_expert_dim, which must be a positive width"
        )
    return dict(
        num_experts=config["num_experts"],
        num_experts_per_token=config["num_experts_per_tok"],
        moe_intermediate_dim=config["moe_intermediate_size"],
        shared_expert_dim=shared,
        normalize_router_weights=bool(config["norm_topk_prob"]),
        router_aux_loss_coefficient=config["router_aux_loss_coef"],
        qkv_bias=bool(config["qkv_bias"]),
        moe_layers=_qwen_moe_layers(config, where),
        capacity_factor=None,
    )


def _qwen_moe_layers(config, where):
    """``moe_layers`` of a qwen2_moe / qwen3_moe config: block i is sparse when it is not in
    ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` == 0 (None: every block)."""
    layers, step = config["num_hidden_layers"], config["decoder_sparse_step"]
    only = [] if config["mlp_only_layers"] is None else config["mlp_only_layers"]  # Qwen2/3MoeConfig read null as []
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise UnsupportedCheckpoint(
            f"{where}: decoder_sparse_step = {step!r} is not a positive integer (block i is sparse when (i + 1) % "
            f"decoder_sparse_step == 0)"
        )
    if not isinstance(only, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in only):
        raise UnsupportedCheckpoint(f"{where}: mlp_only_layers = {only!r} must list block indices in 0..{layers - 1}")
    sparse = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
    if not sparse:
        raise UnsupportedCheckpoint(
            f"{where}: decoder_sparse_step = {step} and mlp_only_layers = {only} leave none of the {layers} blocks "
            f"sparse: the zoo's moe_layers needs at least one (a dense model is model_type {DENSE_TWINS[config['model_type']]})"
        )
    return None if len(sparse) == layers else sparse
