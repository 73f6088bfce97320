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
zoo adds: its tensor-parallel layers take them where nothing splits them (layouts single,
data, fsdp; ``zoo.layers``: under a tensor-parallel layout their shard_map kernels multiply
float kernels, and quantizing is refused in one line), and the order (quantize, then
LoRA). What is left out: the Mixture-of-Experts experts (stacked weights, not Dense
layers) stay in float; each kernel is quantized after loading (Keras reads it into host
memory to quantize it), so the float model must fit first.
"""

import keras

from zoo._compat import deleting_variables_without_full_collections
from zoo.config.choices import QUANTIZATIONS
from zoo.training.lora._layers import layer_prefix, lora_target_layers

INT4_BLOCK = 128  # input rows per int4 scale (Keras' default block size)


def weight_only_config(mode):
    """Keras' quantization config of ``mode`` for weights alone (activations unquantized)."""
    if mode == "int8":
        return keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    return keras.quantizers.Int4QuantizationConfig(activation_quantizer=None, block_size=INT4_BLOCK)


def quantize_frozen(model, mode, *, exclude=()):
    """Quantize the kernels of ``model``'s LoRA target layers (but ``exclude``) to ``mode``
    (``"int8"`` or ``"int4"``), before LoRA is enabled on them; returns the layers."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {mode!r}")
    layers = lora_target_layers(model, exclude)
    adapted = [layer_prefix(layer) for layer in layers if layer.lora_enabled]
    if adapted:
        raise ValueError(f"LoRA is already enabled on {adapted}: quantize the base first, then enable LoRA")
    with deleting_variables_without_full_collections():  # one gc.collect a layer otherwise (zoo._compat)
        for layer in layers:
            layer.quantize(mode, config=weight_only_config(mode))
    return layers
