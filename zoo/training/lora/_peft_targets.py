"""Which modules a PEFT LoRA adapter adapts: its ``adapter_config.json``'s ``target_modules``,
``exclude_modules``, ``layers_to_transform`` and ``layers_pattern``, decided as peft decides
(``LoraConfig.__post_init__``'s refusals, ``LoraModel._prepare_adapter_config``'s default
targets, ``tuners_utils._maybe_include_all_linear_layers`` and
``tuners_utils.check_target_module_exists``). Checked against peft 0.21.2 itself (transformers
5.25.0 and 4.57.6) on every Hugging Face fixture: tests/training/lora/test_peft_oracle.py.

Module names are the transformers model's (``model.layers.0.self_attn.q_proj``, ``lm_head``):
those of the factors in ``adapter_model.safetensors`` after ``base_model.model.``.
"""

import re

# peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the model types the zoo reads:
# what a null target_modules means (peft 0.21.2; qwen2_moe and qwen3_moe have no entry, and
# peft refuses a null target_modules for them)
DEFAULT_TARGETS = {
    model_type: ["q_proj", "v_proj"]
    for model_type in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
}
ALL_LINEAR = "all-linear"  # peft's INCLUDE_LINEAR_LAYERS_SHORTHAND, compared lower-cased
OUTPUT_HEAD = "lm_head"  # the causal LM's output embeddings: "all-linear" leaves them out


def check_targeting(where, config):
    """Refuse, as ``peft.LoraConfig`` refuses, ``layers_to_transform`` or ``layers_pattern`` with a
    string ``target_modules`` (a regex or ``"all-linear"``), and a ``layers_pattern`` without
    ``layers_to_transform``: ``ValueError`` naming ``where`` (the config file)."""
    targets = config.get("target_modules")
    for key in ("layers_to_transform", "layers_pattern"):
        if isinstance(targets, str) and config.get(key) is not None:
            raise ValueError(
                f"{where}: {key} = {config[key]!r} with target_modules = {targets!r}, a string; "
                f"peft refuses {key} with a string target_modules"
            )
    if config.get("layers_pattern") and config.get("layers_to_transform") is None:
        raise ValueError(
            f"{where}: layers_pattern = {config['layers_pattern']!r} without layers_to_transform; peft refuses it"
        )


def default_targets(where, model_type):
    """What a null ``target_modules`` names for ``model_type`` (``DEFAULT_TARGETS``); a
    ``ValueError`` naming ``where`` for a model type peft has no default for."""
    if model_type not in DEFAULT_TARGETS:
        raise ValueError(
            f"{where}: target_modules is null and peft has no default target_modules for model type "
            f"{model_type!r} (it has for {sorted(DEFAULT_TARGETS)})"
        )
    return DEFAULT_TARGETS[model_type]


def is_targeted(config, module, *, model_type=None, where="adapter_config.json"):
    """Whether peft puts LoRA on ``module`` (``model.layers.0.self_attn.q_proj``) under
    ``config`` (``adapter_config.json``'s object), a module of a transformers model of
    ``model_type`` (``llama``; needed only for a null ``target_modules``), as
    ``check_target_module_exists`` decides: not excluded (``exclude_modules``: a string is a
    regex matched whole; a list names the module or its last parts), and named by
    ``target_modules``: a string is a regex matched whole, ``"all-linear"`` (any case) every
    linear module but ``lm_head``; a list names the module (then ``layers_to_transform`` does
    not apply) or its last parts (``q_proj``, ``self_attn.q_proj``); null is peft's default
    for the model type (q_proj, v_proj). With a list, a set ``layers_to_transform`` (an int
    or a non-empty list) keeps the modules whose first block index is in it: the number after
    the first ``<layers_pattern>.`` (a regex; any of a list's), or after the first
    ``<part>.<part>.`` when the pattern is null or empty. A config peft refuses
    (``check_targeting``) raises ``ValueError`` naming ``where``."""
    check_targeting(where, config)
    if _named(config.get("exclude_modules"), module):
        return False
    targets = config.get("target_modules")
    if targets is None:
        targets = default_targets(where, model_type)
    if isinstance(targets, str):
        if targets.lower() == ALL_LINEAR:
            return module != OUTPUT_HEAD
        return re.fullmatch(targets, module) is not None
    if module in targets:
        return True
    if not _named(targets, module):
        return False
    indexes = config.get("layers_to_transform")
    if indexes is None or indexes == []:
        return True
    index = _layer_index(module, config.get("layers_pattern"))
    if index is None:
        return False
    return index == indexes if isinstance(indexes, int) else index in indexes


def _layer_index(module, patterns):
    """The first block index in ``module``'s name, found as peft finds it (lazily: in
    ``model.layers.1.mlp.experts.0.w1`` it is 1, not the expert's 0)."""
    if not patterns:  # None, "" or []: any part before the index
        found = re.match(r".*?\.[^.]*\.(\d+)\.", module)
    else:
        found = None
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            found = re.match(rf"(?:^|.*?\.){pattern}\.(\d+)\.", module)
            if found is not None:
                break
    return None if found is None else int(found.group(1))


def _named(names, module):
    """Whether ``names`` (a regex matched whole, or a list of names or last parts) names ``module``."""
    if not names:
        return False
    if isinstance(names, str):
        return re.fullmatch(names, module) is not None
    return module in names or any(module.endswith(f".{name}") for name in names)
