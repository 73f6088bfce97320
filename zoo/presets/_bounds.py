"""Bounds on the sizes a zoo preset's or ``.keras`` file's ``config.json`` declares, checked before Keras builds anything.

A preset's ``metadata.json`` records each file's SHA-256, which stops an accident, not a
folder made to harm: whoever edits ``config.json`` can record its new digest too. A
500-byte config with ``"num_layers": 1000000000`` would have Keras create a billion
blocks, and ``"hidden_dim": 1000000000`` allocate each norm's 4 GB scale, before any
weight file is compared with them. ``check_config_sizes`` refuses, naming the file, the
key's place in the config and its value, any size above ``SIZE_BOUNDS``: far above any
published model, as the Hugging Face reader's bounds are (``zoo.models.gpt._hf_bounds``,
whose key names are transformers').
"""

from zoo.presets._format import PresetError

# a zoo model's config key -> the largest value a preset may declare
SIZE_BOUNDS = {
    "vocabulary_size": 2**21,  # 2,097,152 (Gemma 3: 262,144)
    "hidden_dim": 2**18,  # the model width C, or a TransformerBlock's MLP width F (Llama 3.1 405B: 16,384, 53,248)
    "intermediate_dim": 2**18,
    "moe_intermediate_dim": 2**18,
    "hidden_units": 2**18,  # the small CNN's dense layer
    "num_layers": 1024,  # (Llama 3.1 405B: 126)
    "num_query_heads": 1024,
    "num_key_value_heads": 1024,
    "num_heads": 1024,
    "head_dim": 4096,
    "num_experts": 4096,
    "top_k": 4096,
    "max_sequence_length": 2**27,  # (Llama 4 Scout: 10,485,760)
    "sequence_length": 2**27,
    "sliding_window": 2**27,
    "num_classes": 2**21,
    "image_size": 2**14,  # pixels a side (a ViT's patches grow with its square)
    "patch_size": 2**14,
    "channels": 4096,
    "filters": 2**16,
}


def check_config_sizes(where, config, error=PresetError):
    """``error`` naming ``where`` (the preset or ``.keras`` file), where in its config.json,
    the key and its value, when a size anywhere in ``config`` (a number, or each number of a
    list) is above its bound."""
    for path, key, value in _sizes(config, ""):
        bound = SIZE_BOUNDS[key]
        if not value <= bound:
            raise error(
                f"{where}: config.json's {path} = {value!r} is above {bound:,}, the most the zoo builds "
                f"(no published model comes near it): a damaged or hostile file, refused before anything is built"
            )


def _sizes(value, path):
    """``(path, key, number)`` for every number under a ``SIZE_BOUNDS`` key inside ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key in SIZE_BOUNDS:
                numbers = item if isinstance(item, (list, tuple)) else [item]
                yield from ((where, key, n) for n in numbers if isinstance(n, (int, float)) and not isinstance(n, bool))
            yield from _sizes(item, where)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _sizes(item, f"{path}[{index}]")
