"""Hugging Face Llama-family checkpoints (dense and Mixture-of-Experts) into and out of ``GPTCausalLM``.

``GPTCausalLM.from_preset(directory)`` reads a folder holding ``config.json`` (a
``model_type`` in ``zoo.config.choices.HF_MODEL_TYPES``; ``_hf_config`` maps and checks
it, as transformers 4 writes it or as transformers 5 does, with ``rope_parameters``),
``model.safetensors`` or its sharded index, and optionally ``tokenizer.json``. The
model is built under the distribution in force and every weight is read from the file
straight into its shards (``zoo.presets.safetensors_weights``). ``_hf_save.save_to_hf`` writes
the same format back (LoRA merged, a pipelined backbone's stacked blocks as its L
layers), loadable by ``transformers`` 4.57 and 5.x (``config.json`` in transformers 4's
keys, each value of the type transformers declares), as a whole folder or not at all
(``zoo.presets._atomic_folder``).

The weight table (L layers; H query heads, K KV heads, D head dim, C hidden, F
intermediate, V vocabulary; ``transpose`` as numpy's axes from the file's shape, the
file's (H*D, C) read as (H, D, C) first):

=======================================  ====================================  ============  ==================
zoo path (``block_<i>/`` per layer)      Hugging Face name                     file shape    to the zoo's
=======================================  ====================================  ============  ==================
token_embedding/embeddings (V, C)        model.embed_tokens.weight             (V, C)        as is
attention/query/kernel (C, H, D)         model.layers.<i>.self_attn.q_proj     (H*D, C)      (H, D, C) -> (2,0,1)
attention/key/kernel (C, K, D)           ...self_attn.k_proj.weight            (K*D, C)      (K, D, C) -> (2,0,1)
attention/value/kernel (C, K, D)         ...self_attn.v_proj.weight            (K*D, C)      (K, D, C) -> (2,0,1)
attention/output/kernel (H, D, C)        ...self_attn.o_proj.weight            (C, H*D)      (C, H, D) -> (1,2,0)
attention/{query,key,value}/bias [1]     ...self_attn.{q,k,v}_proj.bias        (H*D,)        (H, D)
attention/{query,key}_norm/scale [3]     ...self_attn.{q,k}_norm.weight         (D,)          as is
mlp/gate/kernel, mlp/up/kernel (C, F)    ...mlp.gate_proj.weight, up_proj      (F, C)        (1,0)
mlp/down/kernel (F, C)                   ...mlp.down_proj.weight               (C, F)        (1,0)
attention_norm/scale (C,)                ...input_layernorm.weight             (C,)          as is
mlp_norm/scale (C,)                      ...post_attention_layernorm.weight    (C,)          as is
final_norm/scale (C,)                    model.norm.weight                     (C,)          as is
lm_head/kernel (C, V) [2]                lm_head.weight                        (V, C)        (1,0)
=======================================  ====================================  ============  ==================

[1] qwen2 and qwen2_moe. [2] untied only (``tie_word_embeddings`` false). [3] qwen3 and
qwen3_moe (``qk_norm``): one scale for every query head, one for every key head.

A Mixture-of-Experts block (``mixtral``, ``qwen2_moe``, ``qwen3_moe``; E experts of width F) has, in
place of ``mlp/{gate,up,down}/kernel``, the weights of ``MoEFeedForward`` ``mlp``; each
expert is its own tensor in the file, stacked on E by a ``StackedView`` (a device under
the ``expert`` layout reads only its experts' tensors). ``<moe>`` is
``block_sparse_moe.`` (mixtral) or ``mlp.`` (qwen2_moe, qwen3_moe):

=======================================  ==========================================  ============  ==================
zoo path (``block_<i>/mlp/``)            Hugging Face name (``model.layers.<i>.``)   file shape    to the zoo's
=======================================  ==========================================  ============  ==================
router/kernel (C, E)                     <moe>gate.weight                            (E, C)        (1,0)
expert_gate (E, C, F)                    <moe>experts.<j>.w1.weight / gate_proj [3]  E x (F, C)    stack of (1,0)
expert_up (E, C, F)                      <moe>experts.<j>.w3.weight / up_proj        E x (F, C)    stack of (1,0)
expert_down (E, F, C)                    <moe>experts.<j>.w2.weight / down_proj      E x (C, F)    stack of (1,0)
shared_expert/{gate,up,down}/kernel [4]  mlp.shared_expert.{gate,up,down}_proj       as mlp/...    (1,0)
shared_expert_gate/kernel (C, 1) [4]     mlp.shared_expert_gate.weight               (1, C)        (1,0)
=======================================  ==========================================  ============  ==================

[3] mixtral's name / qwen2_moe's and qwen3_moe's. [4] qwen2_moe only. The layer's ``router_statistics``
(what the last training step routed) is state, not a weight: neither read nor written.
"""

import functools
import os

from zoo._compat import sublayers
from zoo.config.choices import LORA_WEIGHTS
from zoo.file_kinds import read_json_file
from zoo.layers import QUANTIZATION_WEIGHTS, fill_quantized, is_built_quantized
from zoo.models.gpt._hf_bounds import check_header_shapes, check_size_bounds, weight_shape
from zoo.models.gpt._hf_config import backbone_arguments
from zoo.models.gpt._hf_export_config import hf_model_type, sparse_layers
from zoo.models.gpt._hf_keys import UnsupportedCheckpoint
from zoo.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from zoo.presets import inside_folder
from zoo.presets.safetensors_weights import (
    CheckpointError,
    SafetensorsFiles,
    StackedView,
    TensorView,
    has_safetensors,
    load_into,
    read_whole,
)
from zoo.tokenizers import HFTokenizer

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    GENERATION_CONFIG_FILE,
)  # what HFTokenizer.from_directory reads
# tensors some checkpoints carry that are not weights (older Llama saves RoPE's table)
NOT_WEIGHTS = ("rotary_emb.inv_freq",)
# zoo variables that are state, not checkpoint weights (MoEFeedForward's last routing statistics)
STATE_VARIABLES = ("router_statistics",)
# MoE model type -> (the block's prefix, {zoo expert weight: each expert's projection})
EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe.", {"expert_gate": "w1", "expert_up": "w3", "expert_down": "w2"}),
    "qwen2_moe": ("mlp.", {"expert_gate": "gate_proj", "expert_up": "up_proj", "expert_down": "down_proj"}),
}
EXPERT_NAMES["qwen3_moe"] = EXPERT_NAMES["qwen2_moe"]  # the same names, without the shared expert
PREPROCESSOR_LENGTH = 1024  # the preprocessor's default sequence_length (keras-hub's), at most max_sequence_length

__all__ = [
    "UnsupportedCheckpoint",
    "backbone_arguments",
    "is_hf_directory",
    "load_causal_lm",
    "load_hf_weights",
    "read_config",
    "weight_shape",
    "weight_views",
]


def is_hf_directory(directory):
    """A folder with a Hugging Face ``config.json`` (it has ``model_type``): with safetensors
    weights, or its config alone (a model's shape: built with ``load_weights=False``, sized
    and compiled, e.g. by ``zoo recipe check``; loading its weights names the missing
    files); ``CheckpointError`` when its ``config.json`` resolves outside the folder or is
    not JSON (a damaged Hugging Face folder, not "not a zoo preset")."""
    if not os.path.isdir(directory):
        return False
    if not has_safetensors(directory) and not os.path.isfile(os.path.join(directory, CONFIG_FILE)):
        return False
    try:
        config = read_config(directory)
    except OSError:  # no config.json (or not a file): not a Hugging Face folder
        return False
    return isinstance(config, dict) and "model_type" in config


def read_config(directory):
    """The folder's ``config.json``, refused (``CheckpointError`` naming the file) when it
    resolves outside the folder, is not a regular file of at most ``MAX_JSON_BYTES``, is not
    JSON (where it breaks), is not a JSON object, or declares a size above the zoo's bounds
    (``_hf_bounds.check_size_bounds``); ``FileNotFoundError`` when there is none."""
    path = inside_folder(directory, CONFIG_FILE, listed_in="the folder", error=CheckpointError)
    config = read_json_file(path, error=CheckpointError)
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{path} holds a JSON {type(config).__name__}, not an object of keys: not a Hugging Face config.json"
        )
    if "model_type" in config:
        check_size_bounds(config, path)
    return config


def weight_views(arguments):
    """``{zoo variable path: TensorView or StackedView}`` for ``GPTBackbone`` arguments
    (the tables above)."""
    heads, width = arguments["num_query_heads"], arguments["hidden_dim"]
    kv_heads = arguments.get("num_key_value_heads") or heads
    head_dim = arguments.get("head_dim") or width // heads
    sparse = set(sparse_layers(arguments))
    model_type = hf_model_type(arguments) if sparse else None
    views = {
        "token_embedding/embeddings": TensorView("model.embed_tokens.weight"),
        "final_norm/scale": TensorView("model.norm.weight"),
    }
    if not arguments.get("tie_word_embeddings", False):
        views["lm_head/kernel"] = TensorView("lm_head.weight", axes=(1, 0))
    for index in range(arguments["num_layers"]):
        hf, zoo = f"model.layers.{index}.", f"block_{index}/"
        for name, count in (("query", heads), ("key", kv_heads), ("value", kv_heads)):
            projection = f"{hf}self_attn.{name[0]}_proj"
            views[f"{zoo}attention/{name}/kernel"] = TensorView(
                f"{projection}.weight", split=(count, head_dim, width), axes=(2, 0, 1)
            )
            if arguments.get("qkv_bias"):
                views[f"{zoo}attention/{name}/bias"] = TensorView(f"{projection}.bias", split=(count, head_dim))
        if arguments.get("qk_norm"):  # (D,) as is
            views.update(
                {
                    f"{zoo}attention/{name}_norm/scale": TensorView(f"{hf}self_attn.{name[0]}_norm.weight")
                    for name in ("query", "key")
                }
            )
        views[f"{zoo}attention/output/kernel"] = TensorView(
            f"{hf}self_attn.o_proj.weight", split=(width, heads, head_dim), split_dim=1, axes=(1, 2, 0)
        )
        if index in sparse:
            views.update(_expert_views(arguments, hf, f"{zoo}mlp/", model_type))
        else:
            views.update(_mlp_views(f"{hf}mlp.", f"{zoo}mlp/"))
        views[f"{zoo}attention_norm/scale"] = TensorView(f"{hf}input_layernorm.weight")
        views.update(_norm_views(hf, zoo, post_norms=arguments.get("post_norms")))
    return views


def _norm_views(hf, zoo, *, post_norms):
    """The block's norms after ``input_layernorm``: Llama's ``post_attention_layernorm`` is the
    MLP's pre-norm; Gemma's (``post_norms``) normalises the attention output, and
    ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` wrap the MLP."""
    if not post_norms:
        return {f"{zoo}mlp_norm/scale": TensorView(f"{hf}post_attention_layernorm.weight")}
    return {
        f"{zoo}attention_post_norm/scale": TensorView(f"{hf}post_attention_layernorm.weight"),
        f"{zoo}mlp_norm/scale": TensorView(f"{hf}pre_feedforward_layernorm.weight"),
        f"{zoo}mlp_post_norm/scale": TensorView(f"{hf}post_feedforward_layernorm.weight"),
    }


def _mlp_views(hf, zoo):
    """A SwiGLU MLP's three kernels: ``<hf>{gate,up,down}_proj.weight`` (out, in) -> ``<zoo>{gate,up,down}/kernel`` (in, out)."""
    return {
        f"{zoo}{name}/kernel": TensorView(f"{hf}{name}_proj.weight", axes=(1, 0)) for name in ("gate", "up", "down")
    }


def _expert_views(arguments, hf, zoo, model_type):
    """The views of one ``MoEFeedForward`` (``zoo`` = ``block_<i>/mlp/``) of a
    ``mixtral``, ``qwen2_moe`` or ``qwen3_moe`` checkpoint (``hf`` = ``model.layers.<i>.``)."""
    block, projections = EXPERT_NAMES[model_type]
    prefix = f"{hf}{block}"
    views = {f"{zoo}router/kernel": TensorView(f"{prefix}gate.weight", axes=(1, 0))}  # (E, C) -> (C, E)
    experts = range(arguments["num_experts"])
    for weight, projection in projections.items():  # E x (F, C) -> (E, C, F); down: E x (C, F) -> (E, F, C)
        views[f"{zoo}{weight}"] = StackedView(
            tuple(TensorView(f"{prefix}experts.{j}.{projection}.weight", axes=(1, 0)) for j in experts)
        )
    if arguments.get("shared_expert_dim"):
        views.update(_mlp_views(f"{prefix}shared_expert.", f"{zoo}shared_expert/"))
        views[f"{zoo}shared_expert_gate/kernel"] = TensorView(
            f"{prefix}shared_expert_gate.weight", axes=(1, 0)
        )  # (1, C) -> (C, 1)
    return views


# --- loading ---------------------------------------------------------------------------


def load_causal_lm(model_class, directory, *, load_weights=True, **overrides):
    """``model_class`` (``GPTCausalLM``) of the Hugging Face folder, built under the current
    distribution, with its weights (each device reading its own shard) and, when the
    folder has ``tokenizer.json``, a ``GPTCausalLMPreprocessor`` on an ``HFTokenizer``.

    Everything that can be checked without the model is checked before it is built: the
    config's keys and numbers, the tokenizer's ids against ``vocab_size``, the files
    (inside the folder, valid safetensors, floating-point tensors) and the tensor names.

    overrides: ``GPTBackbone`` arguments replacing the mapped ones (``dropout=0.1``,
    ``remat="full"``, ``max_sequence_length=4096``, ``megatron_sp=True``).
    """
    where = os.path.join(directory, CONFIG_FILE)
    arguments = {**backbone_arguments(read_config(directory), where=where), **overrides}
    tokenizer = _tokenizer(directory)
    if tokenizer is not None:
        _check_vocabulary(where, arguments["vocabulary_size"], tokenizer)
    if not load_weights:
        return _build(model_class, arguments, tokenizer)
    with SafetensorsFiles(directory) as files:
        views = weight_views(arguments)
        _check_tensor_names(directory, files.names(), views)
        check_header_shapes(directory, files, views, arguments, where)
        model = _build(model_class, arguments, tokenizer)
        _load_from(model, directory, files)
    return model


def _build(model_class, arguments, tokenizer):
    from zoo.models.gpt.gpt_backbone import GPTBackbone

    backbone = GPTBackbone(**arguments)
    length = min(PREPROCESSOR_LENGTH, backbone.max_sequence_length)
    preprocessor = None if tokenizer is None else GPTCausalLMPreprocessor(tokenizer, sequence_length=length)
    return model_class(backbone=backbone, preprocessor=preprocessor)


def _tokenizer(directory):
    """The folder's ``HFTokenizer``, or None without ``tokenizer.json``; each file it reads
    must be inside the folder."""
    if not os.path.lexists(os.path.join(directory, TOKENIZER_FILE)):
        return None
    for name in TOKENIZER_FILES:
        if os.path.lexists(os.path.join(directory, name)):
            inside_folder(directory, name, listed_in="the folder", error=CheckpointError)
    try:
        return HFTokenizer.from_directory(directory)
    except ValueError as error:  # each names its file: a FIFO, not JSON, not a tokenizer the library reads
        raise CheckpointError(str(error)) from None


def _check_vocabulary(where, vocabulary_size, tokenizer):
    """The embedding has a row for every id the tokenizer can produce."""
    ids = max(tokenizer.library.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    if ids > vocabulary_size:
        raise CheckpointError(
            f"{where}: vocab_size = {vocabulary_size} is smaller than the {ids} token ids of {TOKENIZER_FILE} "
            f"(ids {vocabulary_size}..{ids - 1} would have no embedding row)"
        )


def load_hf_weights(model, directory, on_read=None):
    """Every weight of ``model`` (a ``GPTCausalLM``) from the folder's safetensors, each
    device's shard read from disk by itself (``on_read`` sees each slice, for tests).

    Raises ``CheckpointError`` naming a file that cannot be used, a weight the file
    lacks, a shape that differs or a value that is not finite, and
    ``UnsupportedCheckpoint`` naming a tensor the model lacks. LoRA factors, if any,
    keep their values.
    """
    with SafetensorsFiles(directory) as files:
        _load_from(model, directory, files, on_read)


def _load_from(model, directory, files, on_read=None):
    config = model.backbone.get_config()
    _check_tensor_names(directory, files.names(), weight_views(config))
    views = pipelined_views(weight_views(config), config)
    variables = {variable.path: variable for variable in model.weights}
    quantized = {f"{layer.path}/kernel": layer for layer in sublayers(model) if is_built_quantized(layer)}
    stack = model.backbone.pipelined_blocks if model.backbone.stacked else None
    stacked_quantized = {f"blocks/{path}" for path in stack.quantized_layers()} if stack is not None else set()
    _check_variables(views, variables)
    for path, view in views.items():
        if path in quantized:  # QLoRA's base: quantized as read, one float kernel at a time on the host
            fill_quantized(quantized[path], read_whole(view, files))
        elif path in stacked_quantized:  # the same, block by block, into the stack
            stack.fill_quantized(path.split("/", 1)[1], functools.partial(_block_kernel, view, files))
        else:
            load_into(variables[path], files, view, on_read)


def _block_kernel(view, files, index):
    """Block ``index``'s float kernel, read whole from a stacked view ((R, L/R) block views)."""
    per_group = len(view.parts[0].parts)
    return read_whole(view.parts[index // per_group].parts[index % per_group], files)


def pipelined_views(views, config):
    """``views`` for a backbone with stacked blocks (``schedule`` or ``scan_layers`` set; else
    as they are): each block weight's L per-layer views stacked as its ``blocks/<path>``
    variable (R, L/R, ...; scanned: R = 1),
    stack place (r, j) holding layer r * L/R + j, the order ``save_to_hf`` unstacks
    them in (``unstacked_blocks``), so a Hugging Face folder loads into any layout."""
    if config.get("schedule") is None and not config.get("scan_layers"):
        return views
    layers, repeats = config["num_layers"], (config.get("repeats") or 1) if config.get("schedule") else 1
    per_group = layers // repeats  # L/R
    stacked = {path: view for path, view in views.items() if not path.startswith("block_")}
    for suffix in sorted({path.split("/", 1)[1] for path in views if path.startswith("block_")}):
        groups = (
            StackedView(tuple(views[f"block_{group * per_group + index}/{suffix}"] for index in range(per_group)))
            for group in range(repeats)
        )
        stacked[f"blocks/{suffix}"] = StackedView(tuple(groups))  # (R, L/R, *block shape)
    return stacked


def _check_tensor_names(directory, names, views):
    wanted = {name for view in views.values() for name in view.names}
    tied = "lm_head/kernel" not in views
    extra = [
        n for n in names if n not in wanted and not n.endswith(NOT_WEIGHTS) and not (tied and n == "lm_head.weight")
    ]
    if extra:
        raise UnsupportedCheckpoint(
            f"checkpoint {directory!r} holds {len(extra)} tensor(s) the zoo GPT has no weight for, e.g. {extra[:3]} "
            f"(biases, experts or layers beyond its config.json)"
        )
    missing = sorted(wanted - set(names))
    if missing:
        raise CheckpointError(
            f"checkpoint {directory!r} lacks {len(missing)} tensor(s) its config.json implies, e.g. {missing[:3]}"
        )


def _check_variables(views, variables):
    """Every variable has a tensor, but LoRA factors, state, and a quantized kernel's scales."""
    unmapped = sorted(
        path
        for path in variables
        if path not in views and not path.endswith((*LORA_WEIGHTS, *STATE_VARIABLES, *QUANTIZATION_WEIGHTS))
    )
    if unmapped:
        raise CheckpointError(f"the model has weights no Hugging Face tensor maps to: {unmapped[:3]}")
