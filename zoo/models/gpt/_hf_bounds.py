"""Bounds on the sizes a Hugging Face ``config.json`` declares, and its sizes against the
weights' own headers: checked before any table of tensor names is made or any model is built.

A 500-byte ``config.json`` can ask for anything: ``hidden_size: 10**9`` builds a model
whose norms alone take 4 GB; ``num_hidden_layers: 10**9`` a table of ten billion tensor
names. Two checks stop that before anything grows with those numbers:

- ``check_size_bounds`` (on reading the file): every size key holds at most ``SIZE_BOUNDS``,
  far above any published model (Llama 3.1 405B: C 16,384, F 53,248, 126 layers; Gemma 3:
  V 262,144; Qwen3-Next: 512 experts), and layers x experts at most ``MAX_EXPERT_TENSORS``
  / 3 (DeepSeek-V3: 61 x 256);
- ``check_header_shapes`` (with the weights): every weight the config implies has the shape
  of its tensor in the safetensors headers (read from the header only; safetensors checks
  that the headers' shapes cover the file exactly), so the model built holds no more than
  the files do.

Both raise ``CheckpointError`` naming the file, the key or tensor, and the value.
"""

import math

from zoo.presets.safetensors_weights import CheckpointError

# config.json key -> the largest value the zoo reads (a number past it is a damaged or hostile file)
SIZE_BOUNDS = {
    "vocab_size": 2**21,  # 2,097,152 (Gemma 3: 262,144)
    "hidden_size": 2**16,  # 65,536 (Llama 3.1 405B: 16,384)
    "intermediate_size": 2**18,  # 262,144 (Llama 3.1 405B: 53,248)
    "moe_intermediate_size": 2**18,
    "shared_expert_intermediate_size": 2**18,
    "num_hidden_layers": 1024,  # (Llama 3.1 405B: 126)
    "num_attention_heads": 1024,  # (128)
    "num_key_value_heads": 1024,
    "head_dim": 4096,  # (256)
    "num_local_experts": 4096,  # (Qwen3-Next: 512)
    "num_experts": 4096,
    "num_experts_per_tok": 4096,
    "max_position_embeddings": 2**27,  # 134,217,728 (Llama 4 Scout: 10,485,760)
    "sliding_window": 2**27,
    "max_window_layers": 1024,
    "decoder_sparse_step": 1024,
}
MAX_EXPERT_TENSORS = 2**18  # layers x experts x 3 expert tensors (DeepSeek-V3: 61 x 256 x 3 = 46,848)
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")


def check_size_bounds(config, where):
    """``CheckpointError`` naming ``where`` (the file), the key and its value when a size in
    ``config`` (a ``config.json`` dict) is above ``SIZE_BOUNDS`` or layers x experts is too
    many tensors. Values that are not numbers are left to the config's own checks."""
    for key, bound in SIZE_BOUNDS.items():
        value = config.get(key)
        if _number(value) and not value <= bound:
            raise CheckpointError(
                f"{where}: {key} = {value!r} is above {bound:,}, the most the zoo reads (no published model comes "
                f"near it): a damaged file, refused before anything is built"
            )
    layers = config.get("num_hidden_layers")
    experts = next((config[key] for key in EXPERT_COUNT_KEYS if _number(config.get(key))), None)
    if _number(layers) and experts is not None and not layers * experts * 3 <= MAX_EXPERT_TENSORS:
        raise CheckpointError(
            f"{where}: num_hidden_layers = {layers!r} x {experts!r} experts is {layers * experts * 3:,.0f} expert "
            f"tensors, above the {MAX_EXPERT_TENSORS:,} the zoo reads: a damaged file, refused before anything is built"
        )
    if (
        isinstance(config.get("mlp_only_layers"), list)
        and len(config["mlp_only_layers"]) > SIZE_BOUNDS["num_hidden_layers"]
    ):
        raise CheckpointError(
            f"{where}: mlp_only_layers lists {len(config['mlp_only_layers']):,} blocks, above the "
            f"{SIZE_BOUNDS['num_hidden_layers']:,} layers the zoo reads"
        )


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def weight_shape(path, arguments):
    """The shape of the ``GPTBackbone`` weight at ``path`` for ``arguments`` (the tables of
    ``hf_checkpoints``), or None for a path this table does not know."""
    a = arguments
    width, vocabulary, heads = a["hidden_dim"], a["vocabulary_size"], a["num_query_heads"]
    kv_heads = a.get("num_key_value_heads") or heads
    head_dim = a.get("head_dim") or width // heads
    mlp, experts = a.get("intermediate_dim"), a.get("num_experts")
    expert_width, shared = a.get("moe_intermediate_dim") or mlp, a.get("shared_expert_dim")
    table = {
        "token_embedding/embeddings": (vocabulary, width),
        "lm_head/kernel": (width, vocabulary),
        "final_norm/scale": (width,),
        "attention/query/kernel": (width, heads, head_dim),
        "attention/key/kernel": (width, kv_heads, head_dim),
        "attention/value/kernel": (width, kv_heads, head_dim),
        "attention/query/bias": (heads, head_dim),
        "attention/key/bias": (kv_heads, head_dim),
        "attention/value/bias": (kv_heads, head_dim),
        "attention/query_norm/scale": (head_dim,),
        "attention/key_norm/scale": (head_dim,),
        "attention/output/kernel": (heads, head_dim, width),
        "attention_norm/scale": (width,),
        "attention_post_norm/scale": (width,),
        "mlp_norm/scale": (width,),
        "mlp_post_norm/scale": (width,),
        "mlp/gate/kernel": (width, mlp),
        "mlp/up/kernel": (width, mlp),
        "mlp/down/kernel": (mlp, width),
        "mlp/router/kernel": (width, experts),
        "mlp/expert_gate": (experts, width, expert_width),
        "mlp/expert_up": (experts, width, expert_width),
        "mlp/expert_down": (experts, expert_width, width),
        "mlp/shared_expert/gate/kernel": (width, shared),
        "mlp/shared_expert/up/kernel": (width, shared),
        "mlp/shared_expert/down/kernel": (shared, width),
        "mlp/shared_expert_gate/kernel": (width, 1),
    }
    return table.get(path.split("/", 1)[1] if path.startswith("block_") else path)


def check_header_shapes(directory, files, views, arguments, where):
    """``CheckpointError`` when a weight ``config.json`` (``where``) implies differs in shape
    from the tensor ``files`` (``SafetensorsFiles``, headers only) hold for it, naming both;
    a tensor whose element count differs from the implied weight's is refused even where
    the table has no entry."""
    for path, view in views.items():
        expected = weight_shape(path, arguments)
        try:
            found = view.shape_in(files)
        except CheckpointError as error:  # a split that cannot be: the config's heads against the file
            raise CheckpointError(f"{where} does not fit the weights in {directory!r}: {error}") from None
        if expected is not None and tuple(found) != tuple(expected):
            raise CheckpointError(
                f"{where} implies {path} of shape {tuple(expected)} ({math.prod(expected):,} values), but "
                f"{view.name!r} in {directory!r} gives {tuple(found)}: the config does not fit the weights, "
                f"refused before the model is built"
            )
