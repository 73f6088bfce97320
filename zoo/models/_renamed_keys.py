"""Config keys renamed in keras-zoo 0.1 (issue 16), so configs saved before still load.

New code passes only the new names; ``ZooModel.from_config`` (hence ``.keras`` files and
preset ``config.json`` files) maps an old key to its new name first.
"""

# old key -> new key (keras-hub's Llama names; docs/architecture.md, "Vocabulary")
RENAMED_KEYS = {
    "num_heads": "num_query_heads",
    "num_kv_heads": "num_key_value_heads",
    "rotary_base": "rope_max_wavelength",
    "norm_epsilon": "layer_norm_epsilon",
    "tie_embeddings": "tie_word_embeddings",
    "tp_sequence_parallel": "megatron_sp",
    "sequence_parallel": "context_attention",
}


def renamed_keys(config):
    """A copy of ``config`` with every old key under its new name; raises if both are given."""
    config = dict(config)
    for old, new in RENAMED_KEYS.items():
        if old in config:
            if new in config:
                raise ValueError(f"config has both {old!r} (the old name) and {new!r}; keep only {new!r}")
            config[new] = config.pop(old)
    return config
