"""Copying a GPT's weights between its two block forms: L layers ``block_<i>/...`` and
one stacked ``PipelinedBlocks`` ``blocks/...`` (R, L/R, ...) (``GPTCausalLM.with_block_form``).

Stack place (r, j) holds layer r * L/R + j, so the (L, ...) reshape of a stacked weight
is the layers in order (as ``save_to_hf`` and ``zoo.training.checkpoints._block_forms``
read it). Everything else (embedding, final norm, LM head) is copied by path; seed
generator states are left as the target has them (the forms draw dropout differently).
"""

import numpy as np

from zoo.models.gpt._hf_save import unstacked_blocks


def copy_block_form_weights(source, target):
    """Assign ``target``'s variables (a GPTCausalLM) from ``source``'s (the same config in
    either block form); ``ValueError`` naming a variable that has no counterpart, or a
    value of another dtype (an int8 kernel is never cast into a float one)."""
    by_layer = _layer_form_values(source)  # {path as the L-layer form names it: host array}
    stacked = target.backbone.pipelined_blocks.stacked if target.backbone.stacked else {}
    stacked = {variable.path: relative for relative, variable in stacked.items()}
    for variable in target.variables:
        if "seed_generator" in variable.path:
            continue
        paths = [variable.path]  # as the L-layer form names it; a stack's (R, L/R, ...): the L layers in order
        if variable.path in stacked:
            paths = [f"block_{index}/{stacked[variable.path]}" for index in range(target.backbone.num_layers)]
        layers = [by_layer.get(path) for path in paths]
        if any(layer is None for layer in layers):
            raise ValueError(
                f"{variable.path!r} of the {target.name!r} being built has no counterpart in the source model"
            )
        if np.dtype(layers[0].dtype) != np.dtype(variable.dtype):
            raise ValueError(
                f"{paths[0]!r}: the source holds {layers[0].dtype}, the {target.name!r} being built {variable.dtype} "
                "(a quantized base converts only into a model built under the same quantized_policy)"
            )
        value = layers[0] if len(layers) == 1 else np.stack(layers).reshape(variable.shape)
        variable.assign(value.astype(variable.dtype))


def _layer_form_values(model):
    """{path: host array} of ``model``'s weights as the L-layer form names them: its own
    paths, a stacked backbone's blocks unstacked (``_hf_save.unstacked_blocks``)."""
    values = {
        variable.path: np.asarray(variable.value)
        for variable in model.variables
        if not variable.path.startswith("blocks/") and "seed_generator" not in variable.path
    }
    return values | unstacked_blocks(model, merged=False)
