"""Hugging Face ``config.json`` <-> ``GPTBackbone`` arguments for Gemma 2 and Gemma 3 (text).

``gemma2`` (``Gemma2ForCausalLM``) and ``gemma3_text`` (``Gemma3ForCausalLM``) are the zoo
GPT with: RMSNorm times (1 + weight) (``norm="rms_offset"``), a norm before and after each
sublayer (``post_norms``), GeGLU with tanh GELU (``mlp="geglu_tanh"``), embeddings times
sqrt(C) (``scale_embeddings``), attention scale ``query_pre_attn_scalar ** -0.5``, tied
embeddings, and per-layer windows from ``layer_types`` (absent: Gemma 2 slides on even
layers, Gemma 3 where (i + 1) % ``sliding_window_pattern`` (default 6) != 0). Gemma 2 adds
attention-logit and final-logit soft-capping; Gemma 3 adds qk-norm (the same offset
RMSNorm) and a RoPE base of its own for the sliding layers (``rope_local_base_freq``).

transformers 5's form (``rope_parameters``, Gemma 3's nested by layer type) is read as its
transformers 4 keys (``_hf_keys.transformers4_keys``).

Refused, naming the key: ``rope_scaling`` or a ``rope_parameters`` ``rope_type`` other than
``"default"`` (Gemma 3 4B and larger: linear scaling of the global layers, which the zoo's
RoPE does not compute yet), ``use_bidirectional_attention``
true, ``attention_bias`` true, another ``hidden_activation``, untied embeddings, a key
neither listed here nor inert.
"""

import math

from zoo.models.gpt import _hf_keys as common

GEMMA_TYPES = ("gemma2", "gemma3_text")
ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
# config.json key -> GPTBackbone argument
MAPPED = {
    key: common.MAPPED[key]
    for key in (
        "vocab_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_size",
        "intermediate_size",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
    )
}
# inert here: transformers' Gemma reads hidden_activation, never hidden_act; cache_implementation
# is generate()'s cache class; final_logit/attn_logit handled below
IGNORED = common.IGNORED | {"hidden_act", "cache_implementation"}
ALLOWED_VALUES = {
    "hidden_activation": ("gelu_pytorch_tanh",),
    "attention_bias": (False,),
    "tie_word_embeddings": (True,),  # Gemma's head is the embedding; an untied one has no lm_head tensor name here
    "use_bidirectional_attention": (False, None),  # transformers 5 writes Gemma 2's default, null
    "rope_scaling": (None,),
}
READ = {  # read by _arguments, per model type
    "gemma2": {
        "query_pre_attn_scalar",
        "sliding_window",
        "layer_types",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    },
    "gemma3_text": {
        "query_pre_attn_scalar",
        "sliding_window",
        "layer_types",
        "sliding_window_pattern",
        # transformers >= 4.55 saves Gemma3TextConfig's own copy of the pattern beside layer_types
        # (which it always writes, and which decides: _sliding_layers); read by nothing else
        "_sliding_window_pattern",
        "rope_local_base_freq",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    },
}
# Gemma2Config / Gemma3TextConfig defaults for keys a config.json leaves out
DEFAULTS = {
    "gemma2": {
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 8192,
    },
    "gemma3_text": {
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
    },
}


def backbone_arguments(config, where):
    """``GPTBackbone`` arguments for a ``gemma2`` / ``gemma3_text`` config.json."""
    model_type = config["model_type"]
    _check_keys(config, where)
    config = {
        **DEFAULTS[model_type],
        **{key: value for key, value in config.items() if value is not None or key.endswith("softcapping")},
    }
    common.check_numbers(config, where)
    for key in ("query_pre_attn_scalar", "rope_local_base_freq", "attn_logit_softcapping", "final_logit_softcapping"):
        common.positive_number(config, key, where)
    common.positive_int(config, "sliding_window", where, required=True)
    arguments = {argument: config[key] for key, argument in MAPPED.items() if config.get(key) is not None}
    layers = _sliding_layers(config, where)
    arguments.update(
        mlp="geglu_tanh",
        norm="rms_offset",
        post_norms=True,
        scale_embeddings=True,
        tie_word_embeddings=True,
        qkv_bias=False,
        qk_norm=model_type == "gemma3_text",
        attention_scale=float(config["query_pre_attn_scalar"]) ** -0.5,
        attention_logit_softcap=config["attn_logit_softcapping"],
        final_logit_softcap=config["final_logit_softcapping"],
    )
    if model_type == "gemma3_text":
        arguments["local_rope_max_wavelength"] = float(config["rope_local_base_freq"])
    if layers:
        arguments.update(
            sliding_window=config["sliding_window"],
            sliding_window_layers=None if len(layers) == config["num_hidden_layers"] else layers,
        )
    return arguments


def _check_keys(config, where):
    model_type = config["model_type"]
    for key, value in config.items():
        if key in ALLOWED_VALUES and value not in ALLOWED_VALUES[key]:
            why = (
                " (Gemma 3 4B and larger scale the global layers' RoPE linearly, which the zoo does not compute yet)"
                if key == "rope_scaling"
                else ""
            )
            raise common.UnsupportedCheckpoint(
                f"{where}: {key} = {value!r} is not supported for model_type {model_type!r} (the zoo GPT computes "
                f"{key} = {ALLOWED_VALUES[key][0]!r}){why}"
            )
        if key not in MAPPED and key not in IGNORED and key not in ALLOWED_VALUES and key not in READ[model_type]:
            raise common.UnsupportedCheckpoint(
                f"{where}: key {key!r} (= {value!r}) is not one the zoo GPT knows for model_type {model_type!r}; it may "
                f"change the model, so it is refused"
            )


def _sliding_layers(config, where):
    """The indices of the sliding-window layers, as transformers 4.57 reads them."""
    layers, layer_types = config["num_hidden_layers"], config.get("layer_types")
    if layer_types is not None:
        if (
            not isinstance(layer_types, list)
            or len(layer_types) != layers
            or any(t not in common.LAYER_TYPES for t in layer_types)
        ):
            raise common.UnsupportedCheckpoint(
                f"{where}: layer_types = {layer_types!r} must list one of {list(common.LAYER_TYPES)} per layer ({layers})"
            )
        return [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    pattern = 2 if config["model_type"] == "gemma2" else config["sliding_window_pattern"]
    common.positive_int({"sliding_window_pattern": pattern}, "sliding_window_pattern", where)
    return [i for i in range(layers) if (i + 1) % pattern]


def is_gemma(arguments):
    """A ``GPTBackbone`` of ``arguments`` is written as Gemma (it has ``post_norms``)."""
    return bool(arguments.get("post_norms"))


def hf_model_type(arguments):
    """``gemma3_text`` (qk-norm) or ``gemma2``; refuses what neither computes, naming it."""
    model_type = "gemma3_text" if arguments.get("qk_norm") else "gemma2"
    wanted = dict(
        norm="rms_offset",
        mlp="geglu_tanh",
        scale_embeddings=True,
        tie_word_embeddings=True,
        qkv_bias=False,
        num_experts=0,
    )
    problems = [f"{key}={arguments.get(key)!r}" for key, value in wanted.items() if (arguments.get(key) or 0) != value]
    if model_type == "gemma2" and arguments.get("local_rope_max_wavelength") not in (
        None,
        arguments.get("rope_max_wavelength"),
    ):
        problems.append(
            f"local_rope_max_wavelength={arguments['local_rope_max_wavelength']!r} (Gemma 2 has one RoPE base)"
        )
    if arguments.get("rope_scaling") is not None:
        problems.append(f"rope_scaling={arguments['rope_scaling']!r}")
    if problems:
        raise common.UnsupportedCheckpoint(
            f"a GPT with post_norms is written as Gemma 2 / Gemma 3, which need {wanted} and no rope_scaling; "
            f"this one has {', '.join(problems)}"
        )
    return model_type


def hf_config(arguments, *, special_ids=None):
    """The ``config.json`` of a Gemma-shaped ``GPTBackbone`` config."""
    model_type = hf_model_type(arguments)
    layers = arguments["num_layers"]
    window = arguments.get("sliding_window")
    windowed = (
        set()
        if window is None
        else set(
            range(layers) if arguments.get("sliding_window_layers") is None else arguments["sliding_window_layers"]
        )
    )
    heads = common.resolved_heads(arguments)
    config = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "hidden_activation": "gelu_pytorch_tanh",
        "torch_dtype": "float32",
        **{key: arguments[argument] for key, argument in MAPPED.items() if argument in arguments},
        **heads,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "query_pre_attn_scalar": _query_pre_attn_scalar(arguments.get("attention_scale"), heads["head_dim"]),
        "attn_logit_softcapping": arguments.get("attention_logit_softcap"),
        "final_logit_softcapping": arguments.get("final_logit_softcap"),
        "sliding_window": window if window is not None else arguments.get("max_sequence_length"),
        "layer_types": ["sliding_attention" if i in windowed else "full_attention" for i in range(layers)],
    }
    if model_type == "gemma3_text":
        local = arguments.get("local_rope_max_wavelength")
        config.update(
            rope_local_base_freq=arguments["rope_max_wavelength"] if local is None else local, rope_scaling=None
        )
    config.update({key: value for key, value in (special_ids or {}).items() if value is not None})
    return config


def _query_pre_attn_scalar(scale, head_dim):
    """The integer q with ``scale == q ** -0.5`` (None: ``head_dim``), as transformers declares
    ``query_pre_attn_scalar`` (an int: 5.x refuses 16.0); ``scale ** -2`` rounded off its last
    bits (``(144 ** -0.5) ** -2`` is 144.00000000000003). ``UnsupportedCheckpoint`` when no
    integer gives ``scale``."""
    if scale is None:
        return head_dim
    value = float(scale) ** -2
    if not math.isclose(value, round(value), rel_tol=1e-9):
        raise common.UnsupportedCheckpoint(
            f"attention_scale = {scale!r} is not q ** -0.5 for an integer q: Gemma's config.json states it as "
            f"query_pre_attn_scalar, which transformers declares an integer ({value!r} here)"
        )
    return round(value)
