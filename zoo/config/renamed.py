"""Names renamed in keras-zoo 0.1 (issue 16, docs/architecture.md "Vocabulary"), so that
configs saved before still load: each ``from_config`` maps an old key to its new name
first. New code passes only the new names. Recipe keys are refused instead, naming the
new key (``zoo.training.recipes._schema.RENAMED_KEYS``): a file a person edits should say
the new word.
"""

# GPT / encoder / ViT model configs (keras-hub's Llama names)
MODEL_KEYS = {
    "num_heads": "num_query_heads",
    "num_kv_heads": "num_key_value_heads",
    "rotary_base": "rope_max_wavelength",
    "norm_epsilon": "layer_norm_epsilon",
    "tie_embeddings": "tie_word_embeddings",
    "tp_sequence_parallel": "megatron_sp",
    "sequence_parallel": "context_attention",
}
# MultiHeadAttention and TransformerBlock configs (their own heads keep num_heads, num_kv_heads)
ATTENTION_KEYS = {"sequence_parallel": "context_attention", "tp_sequence_parallel": "megatron_sp"}
# ColumnParallelDense, RowParallelDense, ParallelMLP: the bool was Megatron sequence parallelism
TENSOR_PARALLEL_KEYS = {"sequence_parallel": "megatron_sp"}


def renamed_keys(config, renames):
    """A copy of ``config`` with each old key of ``renames`` ({old: new}) under its new
    name; raises if a config holds both."""
    config = dict(config)
    for old, new in renames.items():
        if old in config:
            if new in config:
                raise ValueError(f"config has both {old!r} (the old name) and {new!r}; keep only {new!r}")
            config[new] = config.pop(old)
    return config


# The settings classes before they were named *Settings (zoo.config.settings, bench_settings)
SETTINGS_CLASSES = {
    f"{stem}Config": f"{stem}Settings"
    for stem in (
        "CNNTrain", "Verify", "GPTTrain", "ClassifierTrain", "EncoderTrain", "ViTTrain", "Finetune", "Generate",
        "Export", "CNNBench", "GPTBench", "AttentionBench", "ContextBench", "TPBench", "ScaleBench", "PlanBench",
        "LoraContextBench", "HFLoadBench", "PipelineBench", "MoEBench", "WindowBench",
    )
}  # fmt: skip


def missing_attribute(module, name):
    """What a settings module's ``__getattr__`` raises for ``name``: ImportError naming the
    new class for an old one (so ``from module import OldName`` says it too), else the
    usual AttributeError."""
    if name in SETTINGS_CLASSES:
        return ImportError(f"{module}.{name} was renamed {SETTINGS_CLASSES[name]}")
    return AttributeError(f"module {module!r} has no attribute {name!r}")
