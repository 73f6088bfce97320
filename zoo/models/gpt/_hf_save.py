"""A ``GPTCausalLM`` written as a Hugging Face folder (``save_to_hf``): ``config.json`` in
transformers 4's keys (``_hf_export_config``), ``generation_config.json``, the weights as
safetensors by ``hf_checkpoints.weight_views`` (LoRA merged, stacked blocks as their L
layers), the tokenizer; whole or not at all. ``hf_checkpoints`` reads the same format."""

import json
import os

from zoo._compat import sublayers
from zoo.models.gpt._hf_export_config import hf_config
from zoo.models.gpt._hf_keys import UnsupportedCheckpoint
from zoo.models.gpt._probe import check_finite_logits
from zoo.models.gpt.hf_checkpoints import CONFIG_FILE, GENERATION_CONFIG_FILE, weight_views
from zoo.presets import write_folder_atomically
from zoo.presets.safetensors_weights import (
    CheckpointError,
    write_safetensors,
)


def save_to_hf(model, directory, *, max_file_bytes=None, dtype=None, extra_files=None, report=print):
    """Write ``model`` (a ``GPTCausalLM``) as a Hugging Face folder ``transformers`` loads.

    ``config.json`` (model_type ``llama``, ``mistral`` with a ``sliding_window`` in every
    block, ``qwen2`` with q/k/v biases (a window in blocks m..L-1 as ``use_sliding_window``
    and ``max_window_layers`` m), ``qwen3`` with ``qk_norm``, ``mixtral`` for experts alone,
    ``qwen2_moe`` for experts and a shared expert, ``qwen3_moe`` for ``qk_norm`` and experts:
    ``_hf_export_config.hf_model_type``; another window pattern is refused),
    ``generation_config.json``, the weights as safetensors (one file, or files of at most
    ``max_file_bytes`` with an index), and the tokenizer when the preprocessor's has
    ``save_to_directory`` (``HFTokenizer``; ``ByteTokenizer`` as a byte-level
    ``tokenizer.json``). LoRA factors are merged into their kernels (the model is not
    changed); a pipelined backbone's stacked (R, L/R, ...) weights are written as the L
    layers they hold (``unstacked_blocks``). ``dtype``: e.g. ``"bfloat16"`` to store a
    smaller copy; default the weights' own. ``extra_files(folder)``, when given, writes
    more files into the folder before it is moved into place (``zoo finetune``'s adapter).

    Atomic (``write_folder_atomically``): the whole folder is built beside ``directory``
    and renamed into place in one step, so ``directory`` is either absent or complete;
    a save killed part-way leaves only ``<directory>.partial-*``, which the next save to
    the same ``directory`` removes, naming it through ``report``. An existing non-empty
    ``directory`` is refused. Returns ``directory``.
    """
    directory = os.fspath(directory)
    _check_new_folder(directory)
    arguments = model.backbone.get_config()
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    config = hf_config(arguments, special_ids=_special_ids(tokenizer))
    if dtype is not None:
        config["torch_dtype"] = str(dtype)
    tensors = _file_tensors(model, weight_views(arguments), dtype)
    check_finite_logits(model, directory)  # finite weights can still compute NaN (a 1e38 alpha merged)

    def write(folder):
        write_safetensors(tensors, folder, max_file_bytes=max_file_bytes)
        _write_json(folder, CONFIG_FILE, config)
        _write_json(folder, GENERATION_CONFIG_FILE, _generation_config(tokenizer))
        if hasattr(tokenizer, "save_to_directory"):
            tokenizer.save_to_directory(folder)
        if extra_files is not None:
            extra_files(folder)

    write_folder_atomically(directory, write, report=report)
    return directory


def _check_new_folder(directory):
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise FileExistsError(f"{directory!r} is a file; save_to_hf writes a new folder")
    if os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"{directory!r} exists and is not empty; save_to_hf writes a new folder")


def _file_tensors(model, views, dtype):
    """``{Hugging Face name: numpy array}`` of every weight, LoRA merged, a pipelined
    backbone's blocks unstacked."""
    import numpy as np

    values = {variable.path: variable for variable in model.weights}
    values.update(unstacked_blocks(model))
    values.update(_merged_kernels(model))
    missing = [path for path in views if path not in values]
    if missing:
        raise UnsupportedCheckpoint(
            f"{model.name} has no weight for {len(missing)} Hugging Face tensor(s), e.g. {missing[:3]} "
            f"(its weights: {sorted(values)[:4]} ...)"
        )
    tensors = {}
    for path, view in views.items():
        array = np.asarray(values[path])
        stored = array if dtype is None else array.astype(dtype)
        _check_finite(path, stored, dtype)
        tensors.update(view.file_tensors(stored))
    return tensors


def _check_finite(path, array, dtype):
    """``CheckpointError`` naming the weight when it holds NaN or infinity (as stored, so
    also a value that overflows ``dtype``): raised before the folder is written, as the
    loader refuses such a tensor."""
    import numpy as np

    bad = np.size(array) - np.count_nonzero(np.isfinite(array))
    if bad:
        stored = "" if dtype is None else f" once stored as {dtype}"
        raise CheckpointError(
            f"weight {path!r} of shape {tuple(array.shape)} holds {bad} NaN or infinite value(s){stored}: nothing "
            f"was written (a model from such a folder computes NaN)"
        )


def unstacked_blocks(model, *, merged=True):
    """``{block_<i>/<path>: array}`` of a backbone with stacked blocks (a ``schedule`` or
    ``scan_layers``; {} for another): ``PipelinedBlocks`` keeps block i at ``[i // (L/R), i % (L/R)]`` of each
    (R, L/R, ...) weight whatever the schedule (gpipe R = 1, circular R >= 2) or the
    stage count, so row i of its (L, ...) reshape is layer i. ``merged``: LoRA folded into
    the kernels and its factors left out (``PipelinedBlocks.merged_weights``); else the
    weights as held, factors included."""
    import numpy as np

    if not model.backbone.stacked:
        return {}
    blocks_layer = model.backbone.pipelined_blocks
    weights = (
        blocks_layer.merged_weights()
        if merged
        else {path: variable.value for path, variable in blocks_layer.stacked.items()}
    )
    blocks = {}
    for path, value in weights.items():
        stacked = np.asarray(value)  # (R, L/R, *block shape)
        for index, value in enumerate(stacked.reshape(-1, *stacked.shape[2:])):  # (L, *block shape)
            blocks[f"block_{index}/{path}"] = value
    return blocks


def _merged_kernels(model):
    """``{kernel path: kernel + (alpha / r) a @ b}`` of every layer with LoRA enabled
    (Keras' ``kernel`` property of a LoRA layer is that sum)."""
    merged = {}
    for layer in sublayers(model):
        if getattr(layer, "lora_enabled", False):
            path = next(w.path for w in layer.weights if w.path.endswith("/kernel"))
            merged[path] = layer.kernel
    return merged


def _special_ids(tokenizer):
    if tokenizer is None:
        return {}
    return {
        "bos_token_id": tokenizer.start_token_id,
        "eos_token_id": tokenizer.end_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _generation_config(tokenizer):
    config = {"_from_model_config": True}
    if tokenizer is not None:
        stops = list(tokenizer.stop_token_ids)
        config.update(
            {key: value for key, value in _special_ids(tokenizer).items() if value is not None},
            **({"eos_token_id": stops[0] if len(stops) == 1 else stops} if stops else {}),
        )
    return config


def _write_json(directory, name, value):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
        json.dump(value, file, indent=2, sort_keys=True)
        file.write("\n")
