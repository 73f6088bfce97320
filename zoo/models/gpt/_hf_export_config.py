"""``GPTBackbone`` arguments -> the Hugging Face ``config.json`` of the model type that
computes the same (``hf_config``): Llama-family types here, Gemma 2 and 3 in ``_hf_gemma``;
every value written in the type transformers declares for its key (``written_types``), so
transformers 4 and 5 both load the file. The keys and tables: ``_hf_keys``."""

from zoo.models.gpt import _hf_gemma
from zoo.models.gpt._hf_keys import (
    ARCHITECTURES,
    EVERY_LAYER_WINDOW_TYPES,
    MAPPED,
    MOE_TYPES,
    NULLABLE,
    QK_NORM_TYPES,
    QWEN_TYPES,
    ROPE_SCALING_TYPES,
    WRITTEN_TYPES,
    UnsupportedCheckpoint,
    resolved_heads,
)

# --- GPTBackbone -> config.json ---------------------------------------------------------


def sparse_layers(arguments):
    """The indices of the Mixture-of-Experts blocks of ``GPTBackbone`` arguments."""
    if not arguments.get("num_experts"):
        return []
    moe_layers = arguments.get("moe_layers")
    return list(range(arguments["num_layers"])) if moe_layers is None else sorted(moe_layers)


def hf_model_type(arguments):
    """The Hugging Face ``model_type`` that computes what a ``GPTBackbone`` of
    ``arguments`` computes: ``llama`` (``mistral`` with a ``sliding_window``), ``qwen2``
    (q/k/v biases), ``qwen3`` (qk-norm), ``qwen2_moe`` (experts and a shared expert),
    ``qwen3_moe`` (qk-norm and experts, no shared expert) or ``mixtral`` (experts alone:
    every block sparse, top k renormalised, no biases); ``UnsupportedCheckpoint`` naming
    what none has."""
    if _hf_gemma.is_gemma(arguments):
        return _hf_gemma.hf_model_type(arguments)
    qkv_bias = bool(arguments.get("qkv_bias"))
    if arguments.get("qk_norm"):
        return _qk_norm_model_type(arguments)
    if not arguments.get("num_experts"):
        return "qwen2" if qkv_bias else ("mistral" if arguments.get("sliding_window") is not None else "llama")
    if arguments.get("shared_expert_dim"):
        return "qwen2_moe"
    moe_layers = arguments.get("moe_layers")
    problems = [
        *(["qkv_bias=True"] if qkv_bias else []),
        *([] if arguments.get("normalize_router_weights", True) else ["normalize_router_weights=False"]),
        *(
            [f"moe_layers={moe_layers}"]
            if moe_layers is not None and len(moe_layers) != arguments["num_layers"]
            else []
        ),
    ]
    if problems:
        raise UnsupportedCheckpoint(
            f"a MoE GPT without a shared expert is written as Mixtral, which has every block sparse, top-k weights "
            f"renormalised and no biases; this one has {', '.join(problems)} (Qwen2-MoE has those, with a shared expert: "
            f"shared_expert_dim > 0)"
        )
    return "mixtral"


def _qk_norm_model_type(arguments):
    """``qwen3`` or ``qwen3_moe`` for a GPT with ``qk_norm``; refuses what neither has."""
    problems = [
        *(["qkv_bias=True"] if arguments.get("qkv_bias") else []),
        *(
            [f"shared_expert_dim={arguments['shared_expert_dim']}"]
            if arguments.get("num_experts") and arguments.get("shared_expert_dim")
            else []
        ),
    ]
    if problems:
        raise UnsupportedCheckpoint(
            f"a GPT with qk_norm is written as Qwen3 (dense) or Qwen3-MoE, which have no biases and no shared expert; "
            f"this one has {', '.join(problems)}"
        )
    return "qwen3_moe" if arguments.get("num_experts") else "qwen3"


def hf_config(backbone_config, *, special_ids=None):
    """The ``config.json`` of a ``GPTBackbone`` config, of the ``hf_model_type`` that
    computes the same, each value of the type transformers declares (``written_types``);
    ``UnsupportedCheckpoint`` for a zoo GPT no Llama-family or Gemma model reproduces
    (LayerNorm or a GELU MLP: gpt_125m, say)."""
    if _hf_gemma.is_gemma(backbone_config):
        return written_types(_hf_gemma.hf_config(backbone_config, special_ids=special_ids))
    return written_types(_llama_family_config(backbone_config, special_ids=special_ids))


def written_types(config):
    """``config`` with every value cast to the type ``WRITTEN_TYPES`` declares for its key (an
    int for an int: 16.0 -> 16; a float for a float: 10000 -> 10000.0); ``UnsupportedCheckpoint``
    naming a value that has no such form (an int key holding 16.5), ``KeyError`` for a key the
    table lacks (a writer's key without a declared type: a bug here, caught by the tests)."""
    return {key: _written_value(key, value, WRITTEN_TYPES) for key, value in config.items()}


def _written_value(key, value, types):
    declared = types[key]
    if value is None and key in NULLABLE:
        return None
    if declared is dict:
        return {inner: _written_value(inner, item, ROPE_SCALING_TYPES) for inner, item in value.items()}
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if declared is float and number:
        return float(value)
    if declared is int and number and float(value).is_integer():
        return int(value)
    if isinstance(value, declared) and (declared is not int or number):
        return value
    raise UnsupportedCheckpoint(
        f"config.json {key} = {value!r} cannot be written: transformers declares {key} of type {declared.__name__}"
    )


def _llama_family_config(backbone_config, *, special_ids):
    if backbone_config.get("norm", "rms") != "rms" or backbone_config.get("mlp", "swiglu") != "swiglu":
        raise UnsupportedCheckpoint(
            f"a GPT with norm {backbone_config.get('norm')!r} and mlp {backbone_config.get('mlp')!r} has no Hugging Face "
            f"Llama-family equivalent (it needs norm 'rms' and mlp 'swiglu')"
        )
    model_type = hf_model_type(backbone_config)
    config = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **{key: backbone_config[argument] for key, argument in MAPPED.items() if argument in backbone_config},
        **resolved_heads(backbone_config),
    }
    if model_type == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    else:
        config.update(_window_config(backbone_config, model_type))
    if model_type in QK_NORM_TYPES:
        config.update(attention_bias=False)
    if model_type in MOE_TYPES:
        config.update(_moe_config(backbone_config, model_type))
    config.update({key: value for key, value in (special_ids or {}).items() if value is not None})
    return config


def _window_config(arguments, model_type):
    """The window keys of a mistral / mixtral / qwen2 / qwen2_moe / qwen3 / qwen3_moe
    config.json; refuses a ``sliding_window_layers`` pattern the model type cannot write, naming it."""
    window, layers = arguments.get("sliding_window"), arguments["num_layers"]
    windowed = (
        list(range(layers))
        if arguments.get("sliding_window_layers") is None
        else sorted(arguments["sliding_window_layers"])
    )
    if model_type not in QWEN_TYPES:  # mistral, mixtral: the window is every layer's
        if window is not None and len(windowed) != layers:
            raise UnsupportedCheckpoint(
                f"sliding_window_layers={windowed} of {layers}: {model_type} windows every layer; a window in the "
                f"layers m..L-1 only is written as Qwen2 (qkv_bias=True), any other pattern by no Hugging Face model"
            )
        return {"sliding_window": window}
    if window is None:
        return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": layers}
    first = windowed[0]
    every_layer_only = model_type in ("qwen2_moe", *EVERY_LAYER_WINDOW_TYPES)
    if windowed != list(range(first, layers)) or (every_layer_only and first != 0):
        raise UnsupportedCheckpoint(
            f"sliding_window_layers={windowed} of {layers} cannot be written as {model_type}: its window covers the "
            f"layers max_window_layers..{layers - 1}"
            + (
                f" ({model_type}: every layer only; transformers' eager {ARCHITECTURES[model_type]} windows every layer)"
                if every_layer_only
                else ""
            )
        )
    return {"use_sliding_window": True, "sliding_window": window, "max_window_layers": first}


def _moe_config(arguments, model_type):
    """The Mixture-of-Experts keys of a ``mixtral`` / ``qwen2_moe`` / ``qwen3_moe`` config.json."""
    expert_width = arguments.get("moe_intermediate_dim") or arguments["intermediate_dim"]
    common = dict(
        num_experts_per_tok=arguments["num_experts_per_token"],
        output_router_logits=False,
        router_aux_loss_coef=arguments.get("router_aux_loss_coefficient", 0.0),
    )
    if model_type == "mixtral":  # one width: the experts' (every block is sparse)
        return dict(
            common, num_local_experts=arguments["num_experts"], intermediate_size=expert_width, router_jitter_noise=0.0
        )
    sparse = set(sparse_layers(arguments))
    qwen = dict(
        common,
        num_experts=arguments["num_experts"],
        moe_intermediate_size=expert_width,
        norm_topk_prob=bool(arguments.get("normalize_router_weights", True)),
        decoder_sparse_step=1,
        mlp_only_layers=[i for i in range(arguments["num_layers"]) if i not in sparse],
    )
    if model_type == "qwen3_moe":
        return qwen
    return dict(
        qwen, shared_expert_intermediate_size=arguments["shared_expert_dim"], qkv_bias=bool(arguments.get("qkv_bias"))
    )
