"""The frozen base of QLoRA: each LoRA target layer's kernel stored in int8 or int4.

``quantize_frozen(model, "int8")`` quantizes the kernel of every layer LoRA adapts
(``lora_target_layers``) with Keras' own weight quantization (``layer.quantize``), weights
only: the activations stay in the compute dtype; each matmul multiplies them by the
stored int8 kernel and rescales the product, or by the int4 kernel unpacked and
dequantized block by block (Keras' quantized calls, which also add the layer's LoRA
update factored). So the base takes 1 byte a weight (int8, one scale per
output channel, abs-max) or half a byte (int4, blocks of ``INT4_BLOCK`` input rows, each
with its scale and zero point), against 2 in bfloat16 and 4 in float32.

Why Keras' quantizers and not the zoo's own: they are the layers' own weight formats, so
LoRA on a quantized layer and the quantized call come with them. What the
zoo adds: its tensor-parallel layers take them under every layout (under a tensor-parallel
one each quantized weight is split as the float kernel's shard, and each device dequantizes
its own shard: ``zoo.layers._quantized``), and the order (quantize, then
LoRA). What is left out: the Mixture-of-Experts experts (stacked weights, not Dense
layers) stay in float.

Two ways in. ``quantize_frozen`` quantizes a built float model (Keras reads each kernel
into host memory to quantize it), so the float model must fit first. ``quantized_policy``
is the dtype policy to build the model under instead (``build_for_training(...,
policy=...)``): the targets' kernels are created in int8 / int4 as they are built (Keras'
quantized build, zeros until loaded), never in float, and the embedding and LM head,
frozen under (Q)LoRA, are stored in the compute dtype (bfloat16 under mixed_bfloat16, which
casts them to it for every use anyway). So an 8B base is 1 byte a block weight plus 2 an
embedding weight on the device from the start.
"""

import re

import keras

from zoo._compat import deleting_variables_without_full_collections
from zoo.config.choices import QUANTIZATIONS
from zoo.layers import weight_only_config
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.training.lora._layers import layer_prefix, lora_target_layers

# The layers quantized_policy builds quantized, by path: the attention's and the dense
# MLP's projections (a MoE block's shared expert's too), the zoo's own Dense / EinsumDense
# subclasses, whose quantized build stores the weights alone (weight_only_config).
QUANTIZED_BUILD_PATHS = r"(.*/)?(attention/(query|key|value|output)|mlp/(shared_expert/)?(gate|up|down))"
# The frozen float layers quantized_policy stores in the compute dtype (a tied head is the embedding).
COMPUTE_DTYPE_PATHS = r"(.*/)?(token_embedding|lm_head)"


def quantized_policy(precision, mode):
    """The ``DTypePolicyMap`` a QLoRA base is built under: ``precision`` (a Keras policy
    name, ``"mixed_bfloat16"``) everywhere but ``QUANTIZED_BUILD_PATHS`` (``mode``:
    ``"int8_from_<precision>"``) and ``COMPUTE_DTYPE_PATHS`` (the compute dtype)."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {mode!r}")
    base = keras.dtype_policies.get(precision)
    policies = keras.dtype_policies.DTypePolicyMap(default_policy=base)
    policies[QUANTIZED_BUILD_PATHS] = keras.dtype_policies.get(f"{mode}_from_{base.name}")
    policies[COMPUTE_DTYPE_PATHS] = keras.dtype_policies.get(base.compute_dtype)
    return policies


def building_quantized(mode):
    """A block in which models built (a preset or Hugging Face folder loaded by
    ``load_causal_lm``: its kernels quantized as read) are built under ``quantized_policy``
    of the current global policy and ``mode``."""
    return dtype_policy_scope(quantized_policy(keras.config.dtype_policy().name, mode))


def quantized_build_paths(model):
    """The paths of ``model``'s layers ``QUANTIZED_BUILD_PATHS`` names (built quantized)."""
    pattern = re.compile(QUANTIZED_BUILD_PATHS)
    return [layer_prefix(layer) for layer in lora_target_layers(model) if pattern.fullmatch(layer_prefix(layer))]


def quantize_frozen(model, mode, *, exclude=()):
    """Quantize the kernels of ``model``'s LoRA target layers (but ``exclude``) to ``mode``
    (``"int8"`` or ``"int4"``), before LoRA is enabled on them; returns the layers."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {mode!r}")
    layers = lora_target_layers(model, exclude)
    adapted = [layer_prefix(layer) for layer in layers if layer.lora_enabled]
    if adapted:
        raise ValueError(f"LoRA is already enabled on {adapted}: quantize the base first, then enable LoRA")
    other = [
        f"{layer_prefix(layer)} ({layer.quantization_mode})"
        for layer in layers
        if layer.quantization_mode not in (None, mode)
    ]
    if other:
        raise ValueError(f"quantize={mode!r}, but these layers are built quantized otherwise: {', '.join(other)}")
    with deleting_variables_without_full_collections():  # one gc.collect a layer otherwise (zoo._compat)
        for layer in layers:
            if layer.quantization_mode is None:  # those built quantized (quantized_policy) are already
                layer.quantize(mode, config=weight_only_config(mode))
    return layers
