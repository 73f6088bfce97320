"""Quantized weights of the zoo's Dense / EinsumDense layers: Keras' own formats.

The zoo's projection layers (``AttentionProjection``, ``ColumnParallelDense``,
``RowParallelDense``) built under a quantized dtype policy create their int8 / int4 kernel
and scales as such (Keras' quantized build, zeros), for the weights alone
(``weight_only_config``: the activations stay in the compute dtype, as QLoRA's base
does; Keras' own default for int8 quantizes each input too). ``fill_quantized`` then
gives such a layer the quantized form of a float kernel: a checkpoint's tensor, or a
fresh one from the layer's initializer. ``layer.quantize(mode, config=...)`` quantizes
a built float layer instead (``zoo.training.lora.quantized.quantize_frozen``).
"""

import math

import keras

from zoo._compat import deleting_variables_without_full_collections, sublayers
from zoo.config.choices import LORA_WEIGHTS, QUANTIZATIONS

INT4_BLOCK = 128  # input rows per int4 scale (Keras' default block size)
QUANTIZATION_WEIGHTS = ("kernel_scale", "kernel_zero", "g_idx")  # what Keras stores beside a quantized kernel


def weight_only_config(mode):
    """Keras' quantization config of ``mode`` (``"int8"``, ``"int4"``) for the weights alone:
    the activations stay in the compute dtype (QLoRA's base); None for any other mode."""
    if mode == "int8":
        return keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    if mode == "int4":
        return keras.quantizers.Int4QuantizationConfig(activation_quantizer=None, block_size=INT4_BLOCK)
    return None


def fill_quantized(layer, kernel=None):
    """Give ``layer``, built quantized (int8 or int4), the quantized form of a float kernel:
    ``kernel`` (an array of the float kernel's shape: a checkpoint's tensor), or without it
    a fresh one from the layer's own initializer. Keras quantizes it, through a float twin
    of the layer (its config and build config, public Keras) quantized as ``layer.quantize``
    would have; the twin's kernel, scales and zero points are then assigned to the layer's
    (its bias and LoRA factors keep their values). One kernel in float at a time."""
    quantized = quantized_weights(layer, kernel)
    for variable in layer.weights:
        if _weight_name(variable) in quantized:
            variable.assign(quantized[_weight_name(variable)])


def quantized_weights(layer, kernel=None):
    """``{name: array}``: the weights ``fill_quantized`` gives ``layer`` (``kernel``, and
    its ``kernel_scale``, ``kernel_zero``, ``g_idx`` as Keras stores them), as values; a
    stacked block's (``PipelinedBlocks.fill_quantized``) are those of its template's layer."""
    mode = layer.quantization_mode
    if mode not in QUANTIZATIONS:
        raise ValueError(f"{layer.path!r} is not built quantized (quantization mode {mode!r}; int8 or int4 expected)")
    config = {**layer.get_config(), "dtype": _float_policy(layer)}
    if kernel is not None:  # no random draw for a kernel about to be replaced
        config["kernel_initializer"] = "zeros"
    twin = type(layer).from_config(config)
    twin.build_from_config(layer.get_build_config())
    if kernel is not None:
        if tuple(kernel.shape) != tuple(twin.kernel.shape):
            raise ValueError(
                f"{layer.path!r}: a float kernel of shape {tuple(kernel.shape)} given for a kernel of shape "
                f"{tuple(twin.kernel.shape)}"
            )
        twin.kernel.assign(kernel)
    with deleting_variables_without_full_collections():  # the twin's float kernel goes: no gc.collect
        twin.quantize(mode, config=weight_only_config(mode))
    return {_weight_name(v): v.value for v in twin.weights if _weight_name(v) not in ("bias", *LORA_WEIGHTS)}


def is_built_quantized(layer):
    """Whether ``layer`` holds an int8 or int4 kernel (built quantized or quantized since)."""
    return getattr(layer, "quantization_mode", None) in QUANTIZATIONS


def _float_policy(layer):
    """The float policy a quantized one was derived from: ``int8_from_mixed_bfloat16`` -> ``mixed_bfloat16``."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        policy = policy[layer.path]
    return policy.name.split("_from_")[-1]


def _weight_name(variable):
    return variable.path.rsplit("/", 1)[-1]


def float_parameter_count(model):
    """``model.count_params()`` as the float model counts it: a quantized kernel as the float
    kernel it stands for (Keras' int4 kernel holds two weights a byte), its scales, zero
    points and indices not at all."""
    quantized = {layer.path: (layer, 1) for layer in sublayers(model) if is_built_quantized(layer)}
    for stack in sublayers(model):  # a PipelinedBlocks' quantized stack: its template's layer, L blocks
        for path, layer in getattr(stack, "quantized_layers", dict)().items():
            quantized[f"{stack.path}/{path.rsplit('/', 1)[0]}"] = (layer, stack.num_blocks)
    total = 0
    for variable in model.weights:
        owner, _, name = variable.path.rpartition("/")
        layer, blocks = quantized.get(owner, (None, 1))
        if layer is not None and name in QUANTIZATION_WEIGHTS:
            continue
        if layer is not None and name == "kernel" and layer.quantization_mode == "int4":
            total += blocks * math.prod(_int4_float_shape(layer))
        else:  # a float weight, or an int8 kernel (one weight a byte, the float kernel's shape)
            total += math.prod(variable.shape)
    return total


def _int4_float_shape(layer):
    """The float kernel an int4 layer's packed kernel stands for."""
    if hasattr(layer, "original_kernel_shape"):  # EinsumDense: flattened to (input rows, packed columns)
        return layer.original_kernel_shape
    return (layer.kernel.shape[0], layer.units)  # Dense: (input, units packed two to a byte)
