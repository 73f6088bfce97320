"""Copying a GPT's weights between its two block forms: L layers ``block_<i>/...`` and
one stacked ``PipelinedBlocks`` ``blocks/...`` (R, L/R, ...) (``GPTCausalLM.with_block_form``).

Stack place (r, j) holds layer r * L/R + j, so the (L, ...) reshape of a stacked weight
is the layers in order (as ``save_to_hf`` and ``zoo.training.checkpoints._block_forms``
read it). Everything else (embedding, final norm, LM head) is copied by path; seed
generator states are left as the target has them (the forms draw dropout differently).
"""

import re

import numpy as np

_LAYER = re.compile(r"block_(\d+)/(.+)")


def copy_block_form_weights(source, target):
    """Assign ``target``'s variables (a GPTCausalLM) from ``source``'s (the same config in
    either block form); ``ValueError`` naming a variable that has no counterpart."""
    values = {variable.path: variable for variable in source.variables}
    layers = _layers_of(source)  # {relative path: (L, *block shape) host array} of a stacked source
    for variable in target.variables:
        if "seed_generator" in variable.path:
            continue
        variable.assign(_value_for(variable, values, layers, target).astype(variable.dtype))


def _layers_of(model):
    """{path under a block: its L layers stacked (L, ...)} of a stacked model ({} for L layers)."""
    if not model.backbone.stacked:
        return {}
    stacked = model.backbone.pipelined_blocks.stacked
    return {path: _as_layers(np.asarray(variable.value)) for path, variable in stacked.items()}


def _as_layers(stack):
    return stack.reshape(-1, *stack.shape[2:])  # (R, L/R, ...) -> (L, ...)


def _value_for(variable, values, layers, target):
    """The host array ``variable`` (of ``target``) takes."""
    if variable.path in values and not variable.path.startswith("blocks/"):
        return np.asarray(values[variable.path].value)
    match = _LAYER.fullmatch(variable.path)
    if match and match.group(2) in layers:  # layer i from a stacked source
        return layers[match.group(2)][int(match.group(1))]
    stacked = _stacked_path(variable.path, target)
    if stacked is not None:  # a stacked weight from L layers, or from another stacking
        relative, shape = stacked
        if relative in layers:
            return layers[relative].reshape(shape)
        per_layer = [values.get(f"block_{index}/{relative}") for index in range(target.backbone.num_layers)]
        if all(value is not None for value in per_layer):
            return np.stack([np.asarray(value.value) for value in per_layer]).reshape(shape)
    raise ValueError(f"{variable.path!r} of the {target.name!r} being built has no counterpart in the source model")


def _stacked_path(path, target):
    """(path under a block, shape) when ``path`` is one of ``target``'s stacked weights."""
    if not target.backbone.stacked:
        return None
    for relative, variable in target.backbone.pipelined_blocks.stacked.items():
        if variable.path == path:
            return relative, tuple(variable.shape)
    return None
