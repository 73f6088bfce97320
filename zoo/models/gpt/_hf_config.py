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

import math

from zoo.config.choices import HF_MODEL_TYPES
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
        from zoo.models.gpt import _hf_gemma

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
    from zoo.models.gpt import _hf_gemma

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
    from zoo.models.gpt import _hf_gemma

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


def resolved_heads(arguments):
    """``num_key_value_heads`` and ``head_dim`` of ``GPTBackbone`` arguments as integers (None: H, C / H),
    as config.json must state them (transformers 5 declares both ints, with defaults of its own)."""
    heads = arguments["num_query_heads"]
    return {
        "num_key_value_heads": arguments.get("num_key_value_heads") or heads,
        "head_dim": arguments.get("head_dim") or arguments["hidden_dim"] // heads,
    }


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
