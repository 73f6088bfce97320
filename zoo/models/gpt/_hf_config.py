"""Hugging Face ``config.json`` <-> ``GPTBackbone`` arguments, for Llama-family models.

Supported ``model_type``s (``zoo.config.choices.HF_MODEL_TYPES``): ``llama`` (Llama 1-3.2,
TinyLlama, ...), ``mistral`` without a sliding window, ``qwen2`` (biases on q/k/v). They
are the zoo GPT exactly: RMSNorm, SwiGLU MLP, grouped-query attention, rotate-half RoPE
(with Llama 3's ``rope_scaling``), tied or untied head.

Every key of the file is either mapped, or known to change nothing the zoo computes
(token ids, dtype, bookkeeping), or refused: a key or value that would change the
numbers the zoo cannot reproduce (another ``rope_scaling``, a sliding window, biases the
zoo has no weights for, mixture-of-experts, quantization, another activation) raises
``UnsupportedCheckpoint`` naming it, before anything is built.
"""

from zoo.config.choices import HF_MODEL_TYPES

# config.json key -> GPTBackbone argument
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
    "architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "transformers_version", "use_cache", "initializer_range", "attention_dropout", "_name_or_path",
    "max_window_layers", "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
}  # fmt: skip
# key -> the values the zoo computes exactly; any other value is refused
ALLOWED_VALUES = {
    "hidden_act": ("silu",),  # SwiGLU
    "attention_bias": (False,),  # Llama's biases on all four projections: the zoo GPT has none on the output
    "mlp_bias": (False,),
    "pretraining_tp": (1,),  # >1 changes the matmul order only in Meta's training code, not the model
    "sliding_window": (None,),  # mistral and qwen2: full attention only
    "use_sliding_window": (False,),
}
DEFAULTS = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 2048}


class UnsupportedCheckpoint(ValueError):
    """A Hugging Face config the zoo GPT cannot reproduce; the message names the key."""


def is_hf_config(config):
    return isinstance(config, dict) and "model_type" in config and "class_name" not in config


def backbone_arguments(config, where="config.json"):
    """``GPTBackbone`` arguments for a Hugging Face ``config`` (a dict), or
    ``UnsupportedCheckpoint`` naming the first key the zoo cannot reproduce."""
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise UnsupportedCheckpoint(
            f"{where}: model_type {model_type!r} is not supported; the zoo GPT loads {list(HF_MODEL_TYPES)} "
            f"(docs/checkpoints-hf.md says why others are refused)"
        )
    _check_keys(config, where)
    arguments = {MAPPED[key]: config[key] for key in MAPPED if config.get(key) is not None}
    for key, value in DEFAULTS.items():
        arguments.setdefault(MAPPED[key], value)
    arguments.update(mlp="swiglu", norm="rms", qkv_bias=model_type == "qwen2")
    return arguments


def _check_keys(config, where):
    for key, value in config.items():
        if key in ALLOWED_VALUES and value not in ALLOWED_VALUES[key]:
            raise UnsupportedCheckpoint(f"{where}: {key} = {value!r} is not supported (the zoo GPT computes {key} = {ALLOWED_VALUES[key][0]!r})")
        if key == "layer_types" and any(kind != "full_attention" for kind in value):
            raise UnsupportedCheckpoint(f"{where}: layer_types {sorted(set(value))} is not supported: full attention only")
        if key not in MAPPED and key not in IGNORED and key not in ALLOWED_VALUES and key != "layer_types":
            raise UnsupportedCheckpoint(
                f"{where}: key {key!r} (= {value!r}) is not one the zoo GPT knows; it may change the model "
                f"(mixture-of-experts, quantization, another attention), so it is refused"
            )
    scaling = config.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind != "llama3":
            raise UnsupportedCheckpoint(f"{where}: rope_scaling {scaling!r} is not supported: only rope_type 'llama3'")


def hf_config(backbone_config, *, special_ids=None):
    """The ``config.json`` of a ``GPTBackbone`` config, as ``qwen2`` when it has q/k/v
    biases, else ``llama``; ``UnsupportedCheckpoint`` for a zoo GPT no Llama-family
    model reproduces (LayerNorm or a GELU MLP: gpt_125m, say)."""
    if backbone_config.get("norm", "rms") != "rms" or backbone_config.get("mlp", "swiglu") != "swiglu":
        raise UnsupportedCheckpoint(
            f"a GPT with norm {backbone_config.get('norm')!r} and mlp {backbone_config.get('mlp')!r} has no Hugging Face "
            f"Llama-family equivalent (it needs norm 'rms' and mlp 'swiglu')"
        )
    qwen = bool(backbone_config.get("qkv_bias"))
    config = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **{key: backbone_config[argument] for key, argument in MAPPED.items() if argument in backbone_config},
    }
    if qwen:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config["num_hidden_layers"])
    else:
        config.update(attention_bias=False, mlp_bias=False)
    config.update({key: value for key, value in (special_ids or {}).items() if value is not None})
    return config
