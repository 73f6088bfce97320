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

from zoo._compat import (
    deleting_variables_without_full_collections,
    dequantize_int4_groups,
    einsum_int8_scale_as_kernel,
    sublayers,
)
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


# --- a quantized kernel split over devices (the tensor-parallel layers) --------------------
#
# Keras stores an int8 kernel in its float shape, with one scale per output channel (a
# Dense: (F,); an EinsumDense: in the output's shape, e.g. (1, 1, H, D)), and an int4 kernel
# flattened to rows (the dimensions the input is contracted with) x columns (the others),
# packed two columns a byte, with a scale and a zero point per block of rows and column
# (groups x columns) and each row's group (g_idx). A tensor-parallel layer splits the float
# kernel's dimensions over mesh axes; each of these weights is split the same way on the
# dimensions it shares with the kernel, so every device holds its shard of each, and the
# shard_map body dequantizes its own shard of the kernel (``dequantized_shard``).


QUANTIZED_PARTS = ("kernel", *QUANTIZATION_WEIGHTS)  # a quantized layer's weights that stand for its float kernel


def kernel_and_output_letters(equation):
    """``(kernel, output)``: the letters of an einsum equation's second operand and of its
    result, ``"btc,chd->bthd"`` -> ``("chd", "bthd")``."""
    inputs, output = equation.replace(" ", "").split("->")
    return inputs.split(",")[1], output


def quantized_parts(layer):
    """The names of ``layer``'s weights that make up its quantized kernel (kernel, kernel_scale,
    and int4's kernel_zero and g_idx; ``QUANTIZED_PARTS``), or () for a float layer."""
    if quantized_mode(layer) is None:
        return ()
    held = {variable.name for variable in layer.weights}
    return tuple(name for name in QUANTIZED_PARTS if name in held)


def kernel_dims(layer):
    """``(rows, columns)``: the float kernel's dimensions Keras' int4 flattens into rows (those
    the input is contracted with, leading) and columns. A Dense: ((0,), (1,))."""
    if not isinstance(layer, keras.layers.EinsumDense):
        return (0,), (1,)
    kernel, output = kernel_and_output_letters(layer.equation)
    rows = tuple(i for i, letter in enumerate(kernel) if letter not in output)
    if rows != tuple(range(len(rows))):
        raise ValueError(
            f"{layer.path!r}: equation {layer.equation!r} contracts kernel dimensions {rows}, not the leading ones"
        )
    return rows, tuple(range(len(rows), len(kernel)))


def _flattened_axis(layer, axes):
    """The mesh axis of dimensions flattened into one (int4's rows or columns): the first one's,
    the others whole (a split inside a flattened dimension would not be one contiguous block)."""
    if any(axis is not None for axis in axes[1:]):
        raise ValueError(f"{layer.path!r}: a kernel split over {axes} cannot be flattened into int4's rows or columns")
    return axes[0]


def quantized_axes(layer, name, shape, float_shape, kernel_axes, sizes):
    """Layout axes of the quantized weight ``name`` (kernel, kernel_scale, kernel_zero, g_idx) of
    ``shape``, given the float kernel's shape and axes and the mesh's ``sizes`` ({axis: size});
    None for any other weight. int4's scales and zero points are split on their groups only
    where each shard's rows are whole blocks of ``INT4_BLOCK``; else whole on every device."""
    if quantized_mode(layer) == "int8":
        if name == "kernel":
            return tuple(kernel_axes)
        if name != "kernel_scale":
            return None
        if not isinstance(layer, keras.layers.EinsumDense):
            return (kernel_axes[1],)  # (F,)
        kernel, output = kernel_and_output_letters(layer.equation)
        return tuple(kernel_axes[kernel.index(c)] if c in kernel else None for c in output)  # the output's shape
    rows, columns = kernel_dims(layer)
    row_axis = _flattened_axis(layer, [kernel_axes[i] for i in rows])
    column_axis = _flattened_axis(layer, [kernel_axes[i] for i in columns])
    if name in ("kernel_scale", "kernel_zero") and len(shape) == 2:  # (groups, columns)
        row_count, size = math.prod(float_shape[i] for i in rows), sizes.get(row_axis, 1)
        whole_blocks = row_count % (size * INT4_BLOCK) == 0 and shape[0] * INT4_BLOCK == row_count
        return (row_axis if whole_blocks else None, column_axis)
    if name == "kernel":
        _check_packed_split(layer, shape, math.prod(float_shape[i] for i in columns), column_axis, sizes)
    return {"kernel": (row_axis, column_axis), "kernel_scale": (column_axis,), "g_idx": (row_axis,)}.get(name)


def _check_packed_split(layer, packed_shape, columns, axis, sizes):
    """int4 packs two columns a byte: a split of the packed (rows, columns / 2) kernel over
    ``axis`` must give each device whole bytes, so an even number of columns."""
    size = sizes.get(axis, 1)
    if packed_shape[-1] % size:
        raise ValueError(
            f"{layer.path!r}: int4 packs two columns a byte, and its {columns} columns ({packed_shape[-1]} bytes a row) "
            f"do not split over the {axis!r} mesh axis of size {size}: each device needs an even number of "
            f"columns (a multiple of {2 * size} in all), or quantize to int8"
        )


def quantized_mode(layer):
    """``"int8"`` / ``"int4"`` for a layer built quantized or being quantized (Keras sets
    ``quantization_mode`` only after ``quantize`` has built the weights), else None."""
    return getattr(layer, "quantization_mode", None) or getattr(layer, "quantized_build_mode", None)


def dequantized_shard(layer, weights, local_shape, group_offset=0):
    """Inside a shard_map: this device's float kernel of ``local_shape`` (the layer's compute
    dtype) from its shards of the quantized ``weights`` ({name: array}: kernel, kernel_scale,
    and int4's kernel_zero and g_idx), each already whole over any weight-shard axis.
    ``group_offset``: the first group this device's scales hold (int4 rows split with their
    groups), subtracted from its rows' global group numbers."""
    dtype = layer.compute_dtype
    kernel, scale = weights["kernel"], weights["kernel_scale"]
    if quantized_mode(layer) == "int8":  # int8[local_shape] / scale per output channel
        if isinstance(layer, keras.layers.EinsumDense):
            scale = einsum_int8_scale_as_kernel(layer, scale)  # (1, H/N, D) for (C, H/N, D)
        return (kernel.astype(dtype) / scale).astype(dtype)
    rows, columns = kernel_dims(layer)
    width = math.prod(local_shape[i] for i in columns)
    unpacked = keras.quantizers.unpack_int4(kernel, width, axis=-1, dtype="int8")  # int8[rows, columns]
    if "kernel_zero" in weights:  # blocks of rows, each with its scale and zero point
        groups = weights["g_idx"] - group_offset
        floats = dequantize_int4_groups(unpacked, scale, weights["kernel_zero"], groups)
    else:  # one scale per column
        floats = unpacked.astype("float32") / scale
    return floats.astype(dtype).reshape(local_shape)
