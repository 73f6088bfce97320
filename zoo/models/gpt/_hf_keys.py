"""The Hugging Face ``config.json`` vocabulary the zoo GPT's readers and writers share: what
each key maps to or is known to change nothing, the defaults, the sizes and numbers checked
before anything is built, the types transformers declares for the keys written, and
transformers 5's form of the file read as transformers 4's keys (``transformers4_keys``).
``_hf_config`` (config.json -> ``GPTBackbone``), ``_hf_export_config`` (``GPTBackbone`` ->
config.json) and ``_hf_gemma`` (Gemma 2 and 3 both ways) read it; it imports none of them.
"""

import math

from zoo.presets.safetensors_weights import CheckpointError

# config.json key -> GPTBackbone argument (every model type)
MAPPED = {
    "vocab_size": "vocabulary_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_query_heads",
    "num_key_value_heads": "num_key_value_heads",
    "hidden_size": "hidden_dim",
    "intermediate_size": "intermediate_dim",
    "head_dim": "head_dim",
    "rms_norm_eps": "layer_norm_epsilon",
    "rope_theta": "rope_max_wavelength",
    "rope_scaling": "rope_scaling",
    "max_position_embeddings": "max_sequence_length",
    "tie_word_embeddings": "tie_word_embeddings",
}
# keys that change nothing the zoo computes: special token ids (the tokenizer's), the
# stored dtype (weights are cast to the model's), training-only settings, bookkeeping
IGNORED = {
    "architectures",
    "model_type",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "_name_or_path",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "id2label",
    "label2id",
}
# key -> the values the zoo computes exactly; any other value is refused
ALLOWED_VALUES = {
    "hidden_act": ("silu",),  # SwiGLU
    "attention_bias": (False,),  # Llama's biases on all four projections: the zoo GPT has none on the output
    "mlp_bias": (False,),
    "pretraining_tp": (1,),  # >1 changes the matmul order only in Meta's training code, not the model
}
# read together by _window_arguments (and layer_types by _check_keys)
SLIDING_WINDOW_KEYS = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")
QWEN_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # a window only with use_sliding_window
QWEN_MAX_WINDOW_LAYERS = 28  # Qwen2Config's, Qwen2MoeConfig's and Qwen3Config's default
WINDOW_TYPES = ("mistral", "mixtral")  # sliding_window (when not null) in every layer
EVERY_LAYER_WINDOW_TYPES = ("qwen3_moe",)  # use_sliding_window: every layer (Qwen3MoeConfig reads no max_window_layers)
# transformers' default sliding_window when config.json has no such key
WINDOW_DEFAULTS = {"mistral": 4096, "mixtral": None, "qwen2": 4096, "qwen2_moe": 4096, "qwen3": 4096, "qwen3_moe": 4096}
LAYER_TYPES = ("full_attention", "sliding_attention")  # Qwen2Config.layer_types' values
LAYER_TYPES_READERS = ("qwen2", "qwen3")  # the configs whose layer_types transformers reads
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")  # biases on q/k/v (qwen2_moe: as its qkv_bias key says)
QK_NORM_TYPES = ("qwen3", "qwen3_moe")  # RMSNorm over D of each query and key head, before RoPE
# model type -> its config class' defaults for keys that are not MoE keys (Qwen3Config: head_dim
# 128, not hidden_size / num_attention_heads; Qwen3MoeConfig keeps no default, so C / H there)
TYPE_DEFAULTS = {"qwen3": {"head_dim": 128}}
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
# model type -> its Mixture-of-Experts keys (refused in any other type): mapped by
# _moe_arguments, or training-only (output_router_logits: whether transformers' forward
# returns the router logits and adds the aux loss; the zoo adds router_aux_loss_coefficient
# times it in training either way)
MOE_KEYS = {
    "mixtral": {
        "num_local_experts",
        "num_experts_per_tok",
        "router_aux_loss_coef",
        "output_router_logits",
        "router_jitter_noise",
    },
    "qwen2_moe": {
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "norm_topk_prob",
        "router_aux_loss_coef",
        "output_router_logits",
        "decoder_sparse_step",
        "mlp_only_layers",
        "qkv_bias",
    },
    "qwen3_moe": {
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "router_aux_loss_coef",
        "output_router_logits",
        "decoder_sparse_step",
        "mlp_only_layers",
    },  # no shared expert, no qkv_bias: Qwen2-MoE's keys for them are refused here
}
MOE_ALLOWED_VALUES = {"router_jitter_noise": (0.0,)}  # Mixtral's training-time noise on the router input
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
DEFAULTS = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 2048}
# transformers' MixtralConfig / Qwen2MoeConfig / Qwen3MoeConfig defaults, for keys a config leaves out
MOE_DEFAULTS = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001},
    "qwen2_moe": {
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "qkv_bias": True,
    },
    "qwen3_moe": {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}


# the numbers a config must hold in range (check_numbers): a damaged or hostile file, not an
# unsupported model, so CheckpointError, naming the key and its value
REQUIRED_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")  # null or absent: the default
POSITIVE_NUMBERS = ("rope_theta", "rms_norm_eps")  # finite and > 0 (null or absent: DEFAULTS)
MOE_SIZES = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
}
MOE_EXPERT_COUNT = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts"}
DENSE_TWINS = {"qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}  # the dense model type of a Qwen MoE type
LLAMA3_FACTORS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
)  # rope_scaling's numbers, with original_max_position_embeddings


# transformers 5's rope_parameters (transformers4_keys): rope_type -> the keys it carries besides
# rope_type and rope_theta; the zoo's RoPE computes these two kinds
ROPE_TYPE_KEYS = {"default": (), "llama3": (*LLAMA3_FACTORS, "original_max_position_embeddings")}
ROPE_TYPES = {"gemma2": ("default",), "gemma3_text": ("default",)}  # others: every kind in ROPE_TYPE_KEYS
# model type -> its rope_parameters' layer types -> the transformers 4 key of their rope_theta
# (Gemma3TextConfig nests it; a nested rope_parameters elsewhere is refused)
NESTED_ROPE = {"gemma3_text": {"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}}
# model type -> {transformers 5's config.json key: transformers 4's} (Qwen3MoeConfig's attribute_map)
RENAMED_KEYS = {"qwen3_moe": {"num_local_experts": "num_experts"}}

# config.json key -> the type transformers declares for it, for every key hf_config writes
# (transformers 5's configs are strict dataclasses: an int where a float is declared, or 16.0
# where an int is, is refused; rope_theta / rope_local_base_freq / rope_scaling as its
# rope_parameters declares them); written_types casts and checks
WRITTEN_TYPES = {
    **dict.fromkeys(("architectures", "layer_types", "mlp_only_layers"), list),
    **dict.fromkeys(("model_type", "torch_dtype", "hidden_act", "hidden_activation"), str),
    **dict.fromkeys(
        (
            "vocab_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "hidden_size",
            "intermediate_size",
            "head_dim",
            "max_position_embeddings",
            "sliding_window",
            "max_window_layers",
            "num_experts_per_tok",
            "num_local_experts",
            "num_experts",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "decoder_sparse_step",
            "query_pre_attn_scalar",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
        ),
        int,
    ),
    **dict.fromkeys(
        (
            "rms_norm_eps",
            "rope_theta",
            "rope_local_base_freq",
            "router_aux_loss_coef",
            "router_jitter_noise",
            "attn_logit_softcapping",
            "final_logit_softcapping",
        ),
        float,
    ),
    **dict.fromkeys(
        (
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "use_sliding_window",
            "norm_topk_prob",
            "output_router_logits",
            "qkv_bias",
        ),
        bool,
    ),
    "rope_scaling": dict,
}
ROPE_SCALING_TYPES = {"rope_type": str, **dict.fromkeys(LLAMA3_FACTORS, float), "original_max_position_embeddings": int}
NULLABLE = ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping", "rope_scaling")  # null: none


class UnsupportedCheckpoint(ValueError):
    """A Hugging Face config the zoo GPT cannot reproduce; the message names the key."""


def is_hf_config(config):
    return isinstance(config, dict) and "model_type" in config and "class_name" not in config


def check_numbers(config, where):
    """``CheckpointError`` naming the first number out of range: sizes positive integers,
    heads dividing, ``rope_theta`` and ``rms_norm_eps`` finite and > 0, the MoE counts
    and Llama 3's ``rope_scaling`` factors likewise (MoE defaults filled in first)."""
    model_type = config["model_type"]
    full = {**MOE_DEFAULTS.get(model_type, {}), **config}
    for key in REQUIRED_SIZES + MOE_SIZES.get(model_type, ()):
        if full.get(key) is None:
            raise CheckpointError(f"{where}: {key} is missing; the zoo GPT needs it (a positive integer)")
    for key in REQUIRED_SIZES + OPTIONAL_SIZES + MOE_SIZES.get(model_type, ()):
        positive_int(full, key, where)
    for key in POSITIVE_NUMBERS:
        positive_number(full, key, where)
    if full.get("router_aux_loss_coef") is not None and not _finite(full["router_aux_loss_coef"], minimum=0.0):
        raise CheckpointError(
            f"{where}: router_aux_loss_coef = {full['router_aux_loss_coef']!r} must be a finite number >= 0"
        )
    if not isinstance(full.get("tie_word_embeddings", False), bool):
        raise CheckpointError(f"{where}: tie_word_embeddings = {full['tie_word_embeddings']!r} must be true or false")
    _check_heads(full, where)
    if model_type in MOE_EXPERT_COUNT and full["num_experts_per_tok"] > full[MOE_EXPERT_COUNT[model_type]]:
        count = MOE_EXPERT_COUNT[model_type]
        raise CheckpointError(
            f"{where}: num_experts_per_tok = {full['num_experts_per_tok']} is more than the {full[count]} experts ({count})"
        )
    if isinstance(full.get("rope_scaling"), dict):
        _check_llama3_scaling(full["rope_scaling"], where)


def _check_heads(config, where):
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if heads % kv_heads:
        raise CheckpointError(
            f"{where}: num_attention_heads = {heads} is not a multiple of num_key_value_heads = {kv_heads}"
        )
    head_dim = config.get("head_dim")
    if head_dim is None and config["hidden_size"] % heads:
        raise CheckpointError(
            f"{where}: hidden_size = {config['hidden_size']} is not divisible by num_attention_heads = {heads} (and no head_dim is given)"
        )
    head_dim = head_dim or config["hidden_size"] // heads
    if head_dim % 2:
        raise CheckpointError(
            f"{where}: the head dimension {head_dim} is odd; rotary embeddings rotate pairs of features"
        )


def _check_llama3_scaling(scaling, where, name="rope_scaling"):
    """Llama 3's factors finite and > 0, high over low, original_max_position_embeddings a
    positive integer; ``name``: the config.json key holding them, for the message."""
    for key in LLAMA3_FACTORS:
        if not _finite(scaling.get(key), minimum=0.0) or not scaling[key] > 0:
            raise CheckpointError(f"{where}: {name} {key} = {scaling.get(key)!r} must be a finite number > 0")
    positive_int(scaling, "original_max_position_embeddings", f"{where}: {name}", required=True)
    if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise CheckpointError(
            f"{where}: {name} high_freq_factor = {scaling['high_freq_factor']!r} must exceed "
            f"low_freq_factor = {scaling['low_freq_factor']!r}"
        )


# --- transformers 5's config.json -> transformers 4's keys -----------------------------


def transformers4_keys(config, where="config.json"):
    """``config`` with transformers 5's keys turned into transformers 4's, which the rest of
    this module reads: ``rope_parameters`` into ``rope_theta`` and ``rope_scaling`` (Gemma 3's,
    nested by layer type, into ``rope_theta`` and ``rope_local_base_freq``), Qwen3-MoE's
    ``num_local_experts`` into ``num_experts``; a transformers 4 file comes back as it is.

    What transformers 5 leaves to its defaults stays unset here (a ``rope_parameters`` without
    ``rope_theta``: the file's ``rope_theta`` if any, else the model type's default). A value
    given in both forms that differs is refused (``CheckpointError`` naming both), as is a
    ``rope_parameters`` the zoo cannot compute (``UnsupportedCheckpoint`` naming the key)."""
    model_type = config.get("model_type")
    given = {key: value for key, value in config.items() if key != "rope_parameters"}
    derived = {}  # transformers 4 key -> (value, the transformers 5 key it comes from)
    for key, old_key in RENAMED_KEYS.get(model_type, {}).items():
        if key in given:
            derived[old_key] = (given.pop(key), key)
    if config.get("rope_parameters") is not None:  # null: transformers 5's defaults, as no key
        for key, (value, source) in _rope_keys(model_type, config["rope_parameters"], where).items():
            derived[key] = (value, source)
    for key, (value, source) in derived.items():
        if given.get(key) is not None and given[key] != value:
            raise CheckpointError(
                f"{where}: {key} = {given[key]!r} and {source} = {value!r} disagree (transformers 4 reads the first, "
                f"transformers 5 the second); give one of them"
            )
    return {**given, **{key: value for key, (value, _) in derived.items()}}


def _rope_keys(model_type, rope, where):
    """``{transformers 4 key: (value, the rope_parameters key it comes from)}`` of a ``rope_parameters``."""
    if not isinstance(rope, dict):
        raise CheckpointError(f"{where}: rope_parameters = {rope!r} must be an object of RoPE keys (or null)")
    nested = NESTED_ROPE.get(model_type)
    by_layer_type = [key for key in rope if key in LAYER_TYPES]
    if nested is None:
        if by_layer_type:
            raise UnsupportedCheckpoint(
                f"{where}: rope_parameters nested by layer type ({by_layer_type}) is not supported for model_type "
                f"{model_type!r}: one RoPE for every layer (transformers nests it for gemma3_text)"
            )
        return _one_rope(model_type, rope, "rope_parameters", where, theta_key="rope_theta")
    unknown = [key for key in rope if key not in nested]
    if unknown:
        raise UnsupportedCheckpoint(
            f"{where}: rope_parameters key {unknown[0]!r} (= {rope[unknown[0]]!r}) is not one the zoo GPT knows for "
            f"model_type {model_type!r}: its rope_parameters is nested by layer type, {list(nested)}"
        )
    keys = {}
    for layer_type, theta_key in nested.items():
        if layer_type in rope:  # absent: transformers 5 takes theta_key's value, else its default
            name = f"rope_parameters.{layer_type}"
            if rope[layer_type] is None:
                raise UnsupportedCheckpoint(f"{where}: {name} = None (no RoPE in those layers) is not supported")
            keys.update(_one_rope(model_type, rope[layer_type], name, where, theta_key=theta_key))
    return keys


def _one_rope(model_type, rope, name, where, *, theta_key):
    """``{theta_key: ..., "rope_scaling": ...}`` of one flat RoPE dict (``name``: its key, for
    messages), checked as ``rope_theta`` and ``rope_scaling`` are."""
    if not isinstance(rope, dict):
        raise CheckpointError(f"{where}: {name} = {rope!r} must be an object of RoPE keys")
    kind = rope.get("rope_type", rope.get("type", "default"))
    kinds = ROPE_TYPES.get(model_type, tuple(ROPE_TYPE_KEYS))
    if kind not in kinds:
        raise UnsupportedCheckpoint(
            f"{where}: {name} rope_type = {kind!r} is not supported for model_type {model_type!r} (the zoo GPT "
            f"computes rope_type {' or '.join(map(repr, kinds))})"
        )
    for key, value in rope.items():
        if key not in ("rope_type", "type", "rope_theta", *ROPE_TYPE_KEYS[kind]):
            raise UnsupportedCheckpoint(
                f"{where}: {name} key {key!r} (= {value!r}) is not one the zoo GPT knows for rope_type {kind!r}; it "
                f"may change the model, so it is refused"
            )
    keys = {}
    if rope.get("rope_theta") is not None:
        positive_number(rope, "rope_theta", f"{where}: {name}")
        keys[theta_key] = (rope["rope_theta"], f"{name}.rope_theta")
    if theta_key == "rope_theta":  # the global layers' RoPE: their scaling too
        scaling = None
        if kind == "llama3":
            scaling = {"rope_type": kind, **{key: rope.get(key) for key in ROPE_TYPE_KEYS[kind]}}
            _check_llama3_scaling(scaling, where, name=name)
        keys["rope_scaling"] = (scaling, name)
    return keys


def positive_int(config, key, where, required=False):
    value = config.get(key)
    if value is None and not required:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{where}: {key} = {value!r} must be a positive integer")


def positive_number(config, key, where):
    value = config.get(key)
    if value is not None and not (_finite(value, minimum=0.0) and value > 0):
        raise CheckpointError(f"{where}: {key} = {value!r} must be a finite number > 0")


def _finite(value, minimum):
    """``value`` is a JSON number (not a bool), finite and >= ``minimum``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= minimum


def resolved_heads(arguments):
    """``num_key_value_heads`` and ``head_dim`` of ``GPTBackbone`` arguments as integers (None: H, C / H),
    as config.json must state them (transformers 5 declares both ints, with defaults of its own)."""
    heads = arguments["num_query_heads"]
    return {
        "num_key_value_heads": arguments.get("num_key_value_heads") or heads,
        "head_dim": arguments.get("head_dim") or arguments["hidden_dim"] // heads,
    }
