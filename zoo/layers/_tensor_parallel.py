"""What the tensor-parallel layers share: the mesh lookup, weight layouts, shard_map dispatch.

The mesh is the global Keras distribution's (``keras.distribution.distribution()``).
Tensor parallelism is on when that mesh has the layer's model axis with size > 1;
otherwise (no distribution, ``DataParallel``, a model axis of size 1) the layers are
ordinary ``keras.layers.Dense`` layers computing the same numbers.

Under a ``zoo.distribution.ContextParallel`` distribution the sequence (dim 1 of every
activation of rank >= 3) stays split over its sequence axis in the shard_map specs, so
a TP layer on a ``data,seq,model`` mesh never all-gathers the sequence; with Megatron
sequence parallelism dim 1 is split over both, ``(seq, model)``.

Weights carry their layouts from creation: ``_TensorParallelDense.add_weight`` gives
each weight Keras creates (kernel, bias, and the LoRA factors ``enable_lora`` adds)
the layout its ``WEIGHT_AXES`` names, as the variable's own ``layout``. Keras'
``ModelParallel.get_variable_layout`` then returns it without consulting the layout
map (and the optimizer's slots copy it), so no user rule can place these weights
differently from how the shard_map body slices them: a greedy rule such as
``.*kernel`` cannot catch ``lora_kernel_a`` (keras-team/keras#19496) and a renamed
layer cannot silently fall back to replication (keras-hub#2806).

FSDP inside tensor parallelism: when the distribution names a ``weight_shard_axis``
(``fsdp+tp``: ``data``; ``ContextParallel``: its sequence axis) each kernel is also
split over that axis on its other dimension, e.g. a column kernel (C, F) as
(data, model), a row kernel (F, C) as (model, data). The shard_map body all-gathers
it over that axis just before the matmul (``gather_weight``); the transpose of that
all-gather reduce-scatters the kernel's gradient, so no device ever holds more than
its 1/(data x model) of a weight, its gradient or its optimizer slots between steps.

Mesh axes of size 1 are left out of the plan (batch, sequence, weight-shard axis), so
no shard_map here names one and no collective runs over one.

LoRA, factored: Keras computes a LoRA layer with the merged kernel ``kernel + (alpha/r)
a @ b``, so its backward forms the whole (C, F) gradient x^T dy of the merged kernel, as
costly as the frozen kernel's own weight gradient, before projecting it onto a and b.
Here a LoRA layer computes ``x @ kernel + (alpha/r) (x @ a) @ b`` instead
(``lora_update``; EinsumDense: the same equation with the kernel's last dimension replaced
by r, then r contracted with b), so the backward computes only d(x) through the frozen
kernel and the factors' rank-r gradients. The tensor-parallel layers do it in their own
calls; ``factored_lora_call`` is the same for a plain Keras Dense / EinsumDense, which
``zoo.training.finetune.enable_lora`` installs as the layer's ``call``. Saving is Keras'
(the merged kernel in ``.keras`` files; ``.kernel`` stays the merged kernel).
"""

import jax
import jax.numpy as jnp
import keras
from jax.sharding import PartitionSpec as P

from zoo._compat import add_weight_with_layout, record_int4_input_dim
from zoo.config.choices import LORA_WEIGHTS
from zoo.config.renamed import TENSOR_PARALLEL_KEYS, renamed_keys
from zoo.distribution.axes import MODEL
from zoo.kernels.collective_matmul import vary_over
from zoo.kernels.tensor_parallel import check_divisible, sequence_parallel_row_matmul
from zoo.layers._parallel_plan import resolve_plan, run_sharded
from zoo.layers._quantized import (
    QUANTIZED_PARTS,
    dequantized_shard,
    kernel_and_output_letters,
    quantized_axes,
    quantized_mode,
    quantized_parts,
    weight_only_config,
)

SHARD = "shard"  # placeholder in layout axes for the plan's weight-shard axis (FSDP inside TP)


def activation_spec(plan, rank, *, sequence=False, features=False):
    """PartitionSpec of an activation [B, T, ..., C]: batch over the batch axis, and the
    sequence (dim 1) or the features (last dim) over the model axis.

    Under context parallelism dim 1 of a rank >= 3 activation is also split over the
    plan's sequence axis: (B/Nd, T/Ns, ...), or (B/Nd, T/(Ns*N), ...) with ``sequence``
    (N the model axis' size; the sequence axis major: each model shard holds a slice of
    its seq shard)."""
    spec = [None] * rank
    spec[0] = plan.batch_axis
    if plan.sequence_axis is not None and rank >= 3:
        spec[1] = plan.sequence_axis
    if sequence:
        spec[1] = plan.model_axis if spec[1] is None else (spec[1], plan.model_axis)
    if features:
        spec[-1] = plan.model_axis
    return P(*spec)


def check_input(layer, plan, shape, *, sequence):
    """Raise, naming the numbers, unless ``shape``'s batch (and sequence) split evenly."""
    where = f"{type(layer).__name__} {layer.name!r}"
    if plan.batch_axis and shape[0] is not None and shape[0] % plan.batch_size:
        raise ValueError(
            f"{where}: batch size {shape[0]} is not divisible by the {plan.batch_axis!r} mesh axis of size {plan.batch_size}"
        )
    if sequence and len(shape) < 3:
        raise ValueError(f"{where}: sequence parallelism needs inputs (B, T, ..., C), got shape {tuple(shape)}")
    splits = ([(plan.sequence_axis, plan.sequence_size)] if plan.sequence_axis and len(shape) >= 3 else []) + (
        [(plan.model_axis, plan.model_size)] if sequence else []
    )  # the mesh axes dim 1 is split over, major first
    if not splits or shape[1] is None:
        return
    if len(splits) == 1:
        ((axis, size),) = splits
        check_divisible(shape[1], axis_size=size, axis_name=axis, what=f"{where}: sequence length")
    elif shape[1] % (splits[0][1] * splits[1][1]):
        (seq_axis, seq_size), (model_axis, model_size) = splits
        raise ValueError(
            f"{where}: sequence length {shape[1]} is not divisible by the {seq_axis!r} x {model_axis!r} mesh axes "
            f"of size {seq_size} x {model_size} = {seq_size * model_size} (context parallelism with Megatron "
            f"sequence parallelism splits the sequence over both)"
        )


def tensor_parallel_plan(model_axis):
    """The ``ParallelPlan`` of a tensor-parallel layer splitting over ``model_axis``, or
    None when that axis splits nothing (the layers are then plain Keras layers)."""
    plan = resolve_plan(model_axis=model_axis)
    return plan if plan.tensor_parallel else None


def quantize_layer(layer, kind, mode, **kwargs):
    """Keras' quantization of a zoo ``Dense`` / ``EinsumDense`` subclass (``kind.quantize``:
    the kernel stored in int8 or int4 with its scales, Keras' quantized call from then on).
    Under a tensor-parallel plan the quantized weights are created with the shards of the
    float kernel's layout (``zoo.layers._quantized.quantized_axes``) and each device's
    shard_map body dequantizes its own shard. (Keras resolves a missing ``config`` to its
    default, the inputs quantized too, before the layer sees the call: QLoRA passes
    ``weight_only_config``.)"""
    kind.quantize(layer, mode, type_check=False, **kwargs)


def quantized_build(layer, kind, kernel_shape, mode, config=None):
    """``kind.quantized_build``: the int8 / int4 kernel and its scales created as such, no
    float kernel first, when the layer is built under a quantized dtype policy
    (``"int8_from_mixed_bfloat16"``, a ``DTypePolicyMap`` naming it; QLoRA's quantized
    build), or quantized since (Keras' ``quantize`` builds the same way). Built so, a layer
    without a ``quantization_config`` quantizes its weights alone (``weight_only_config``).
    The mode and the float kernel's shape are recorded first: the quantized weights'
    layouts are read from them as Keras creates each weight."""
    layer.quantized_build_mode = mode
    layer.quantized_kernel_shape = tuple(int(d) for d in kernel_shape)
    kind.quantized_build(layer, kernel_shape, mode, config or weight_only_config(mode))
    if mode == "int4" and kind is keras.layers.Dense:  # else enable_lora unpacks the kernel for its shape
        record_int4_input_dim(layer, kernel_shape[0])


def axis_sizes(plan):
    """{mesh axis: size} of the axes a tensor-parallel layer's weights split over."""
    return {plan.model_axis: plan.model_size, plan.weight_shard_axis: plan.weight_shard_size}


def local_quantized_kernel(layer, weights, plan, axes_of, kernel_axes):
    """Inside the shard_map: this device's float kernel, dequantized from its shards of the
    quantized weights (each first all-gathered over the weight-shard axis, if split over it).
    ``axes_of(name)``: a weight's layout axes; ``kernel_axes``: the float kernel's."""
    names = [name for name in QUANTIZED_PARTS if name in weights]
    axes = {name: axes_of(name) for name in names}
    whole = {name: gather_weight(weights[name], axes[name], plan) for name in names}
    local_shape = tuple(
        d // plan.model_size if axis == plan.model_axis else d
        for d, axis in zip(layer.quantized_kernel_shape, kernel_axes)
    )  # the float kernel's shard, e.g. (C, F/N)
    offset = 0  # int4 rows split over the model axis with their groups: this shard's first group
    if "kernel_zero" in names and axes["kernel_scale"][0] == plan.model_axis:
        offset = jax.lax.axis_index(plan.model_axis) * whole["kernel_scale"].shape[0]
    return dequantized_shard(layer, whole, local_shape, offset)


def resolve_axes(axes, plan):
    """Layout axes with the placeholders resolved: ``"model"`` -> the plan's model axis,
    ``"shard"`` -> its weight-shard axis (None without one)."""
    names = {MODEL: plan.model_axis, SHARD: plan.weight_shard_axis}
    return tuple(names.get(axis, axis) if axis is not None else None for axis in axes)


def describe_split(kind, plan, collectives):
    """``"<kind> over model (4), <collectives>"``, and what else the plan splits, in words."""
    parts = [f"{kind} over {plan.model_axis} ({plan.model_size})", collectives]
    if plan.sequence_axis is not None:
        parts.append(f"sequence stays split over {plan.sequence_axis} ({plan.sequence_size})")
    if plan.weight_shard_axis is not None:
        parts.append(f"kernels all-gathered over {plan.weight_shard_axis} ({plan.weight_shard_size}) per call")
    return ", ".join(parts)


def sequence_collective(kind, collective_matmul):
    """``"all-gather of the input over the sequence per call"`` (Megatron SP), in words."""
    overlap = " overlapped with the matmul" if collective_matmul else ""
    return f"{kind} over the sequence per call{overlap}"


def gather_weight(value, axes, plan):
    """Inside the shard_map: a weight's shard all-gathered over the plan's weight-shard
    axis on the dimension its ``axes`` split over it; unchanged without one.

    E.g. a column kernel f32[C/Nw, F/N] -> f32[C, F/N]. The transpose of the tiled
    all-gather is a reduce-scatter: the gradient leaves the body split as the weight is.
    The shard is first made varying over the batch axis, so the gradient's sum over the
    batch runs on the shard (1/Nw of the bytes) rather than on the gathered weight.
    """
    axis = plan.weight_shard_axis
    if axis is None or axis not in axes:
        return value
    if plan.batch_axis not in (None, axis):
        value = vary_over(value, plan.batch_axis)
    return jax.lax.all_gather(value, axis, axis=axes.index(axis), tiled=True)


class WeightsPlacedAtCreation:
    """Mixin for a Keras layer with a ``model_axis``: ``add_weight`` creates each weight
    with the layout ``self.creation_axes(name, shape, plan)`` names under the current
    plan, as the variable's own layout (None, or no plan: Keras places it as usual)."""

    def add_weight(
        self,
        *args,
        shape=None,
        initializer=None,
        dtype=None,
        trainable=True,
        autocast=True,
        regularizer=None,
        constraint=None,
        aggregation="none",
        overwrite_with_gradient=False,
        name=None,
    ):
        """``Layer.add_weight``, creating the kernel, bias and LoRA factors with their layout."""
        options = dict(
            shape=shape,
            initializer=initializer,
            dtype=dtype,
            trainable=trainable,
            autocast=autocast,
            regularizer=regularizer,
            constraint=constraint,
            aggregation=aggregation,
            overwrite_with_gradient=overwrite_with_gradient,
            name=name,
        )
        plan = tensor_parallel_plan(self.model_axis)
        axes = None if plan is None or args or shape is None else self.creation_axes(name, shape, plan)
        if axes is None:
            return super().add_weight(*args, **options)
        return add_weight_with_layout(self, plan.layout(axes), **options)


class _TensorParallelDense(WeightsPlacedAtCreation, keras.layers.Dense):
    """A ``Dense`` whose kernel is split over ``model_axis``; subclasses say how.

    Subclasses set ``WEIGHT_AXES`` ({weight name: layout axes with "model" standing
    for the model axis and "shard" for the plan's weight-shard axis, FSDP inside TP})
    and ``SPLIT`` (which kernel dimension is split over the model axis), and implement
    ``_local_call(x, weights, plan)``, the per-shard matmul (the activation is applied
    to its result outside the ``shard_map``).
    """

    WEIGHT_AXES = {}
    SPLIT = None  # "units" (output features) or "input features"
    KIND = None  # in words, for describe_parallelism

    def __init__(self, units, *, megatron_sp=False, collective_matmul=False, model_axis=MODEL, **kwargs):
        super().__init__(units, **kwargs)
        if collective_matmul and not megatron_sp:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: collective_matmul overlaps the sequence "
                f"all-gather/reduce-scatter, so it needs megatron_sp=True"
            )
        self.megatron_sp = bool(megatron_sp)
        self.collective_matmul = bool(collective_matmul)
        self.model_axis = model_axis

    # --- weights, placed at creation -----------------------------------------------

    def build(self, input_shape):
        plan = tensor_parallel_plan(self.model_axis)
        if plan is not None:
            self.check_features(input_shape[-1], plan)
        super().build(input_shape)

    def check_features(self, input_dim, plan):
        """Raise unless the kernel's split dimensions divide by their mesh axes."""
        where = f"{type(self).__name__} {self.name!r}"
        sizes = {"units": self.units, "input features": input_dim}
        model_dim, shard_dim = ("units", "input features") if self.SPLIT == "units" else ("input features", "units")
        check_divisible(
            sizes[model_dim], axis_size=plan.model_size, axis_name=plan.model_axis, what=f"{where}: {model_dim}"
        )
        if plan.weight_shard_axis is not None:
            check_divisible(
                sizes[shard_dim],
                axis_size=plan.weight_shard_size,
                axis_name=plan.weight_shard_axis,
                what=f"{where} (kernel split FSDP-style over {plan.weight_shard_axis!r}): {shard_dim}",
            )

    def weight_axes(self, name, plan, shape=None):
        """Layout axes of weight ``name`` (of ``shape``: read from the weight when None) under
        ``plan`` (None: not ours to place); a quantized weight's follow the float kernel's."""
        if name in QUANTIZED_PARTS and quantized_mode(self) is not None:
            shape = shape or next(v.shape for v in self.weights if v.name == name)
            kernel_axes = resolve_axes(self.WEIGHT_AXES["kernel"], plan)
            return quantized_axes(self, name, shape, self.quantized_kernel_shape, kernel_axes, axis_sizes(plan))
        axes = self.WEIGHT_AXES.get(name)
        return None if axes is None else resolve_axes(axes, plan)

    def creation_axes(self, name, shape, plan):
        """Layout axes ``WeightsPlacedAtCreation`` gives weight ``name`` (None: Keras decides)."""
        return self.weight_axes(name, plan, shape)

    def quantize(self, mode=None, **kwargs):
        quantize_layer(self, keras.layers.Dense, mode, **kwargs)

    def quantized_build(self, kernel_shape, mode, config=None):
        quantized_build(self, keras.layers.Dense, kernel_shape, mode, config)

    # --- calls ---------------------------------------------------------------------

    def compute_output_spec(self, inputs, *args, **kwargs):
        # Symbolic shapes (None batch) cannot be split over a mesh: shapes only.
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self.compute_dtype)

    def call(self, inputs, training=None):
        plan = tensor_parallel_plan(self.model_axis)
        if plan is None:
            return factored_lora_call(self, inputs) if self.lora_enabled else super().call(inputs)
        check_input(self, plan, inputs.shape, sequence=self.megatron_sp)
        self.check_features(inputs.shape[-1], plan)
        weights, specs = self.sharded_weights(plan)
        in_spec, out_spec = self.activation_specs(plan, len(inputs.shape))
        y = run_sharded(plan, self._local_call, (inputs, weights), (in_spec, specs), out_spec, plan=plan)
        # The activation is elementwise: applied outside the shard_map it moves nothing,
        # and JAX 0.12 cannot differentiate the erf family (exact GELU) inside one
        # (``zoo.kernels.tensor_parallel.mlp_activation``).
        return y if self.activation is None else self.activation(y)

    def sharded_weights(self, plan):
        """``({name: array}, {name: PartitionSpec})`` of the weights the shard body needs."""
        quantized = list(quantized_parts(self))
        names = (
            (quantized or ["kernel"])
            + (["bias"] if self.bias is not None else [])
            + (list(LORA_WEIGHTS) if self.lora_enabled else [])
        )
        variables = {"kernel": kernel_variable(self), "bias": self.bias}
        variables.update({n: getattr(self, n) for n in [*quantized[1:], *(LORA_WEIGHTS if self.lora_enabled else ())]})
        return {n: variables[n].value for n in names}, {n: P(*self.weight_axes(n, plan)) for n in names}

    def local_kernel(self, weights, plan):
        """Inside the shard_map: this shard's (frozen, under LoRA) kernel, all-gathered
        over the weight-shard axis if any. The LoRA update is not merged into it: it is
        applied factored (``local_lora``, ``column_lora`` / ``row_matmul_with_lora``). A
        quantized kernel's shard is dequantized here (``local_quantized_kernel``)."""
        if quantized_mode(self) is not None:
            kernel_axes = resolve_axes(self.WEIGHT_AXES["kernel"], plan)
            return local_quantized_kernel(self, weights, plan, lambda name: self.weight_axes(name, plan), kernel_axes)
        return gather_weight(weights["kernel"], self.weight_axes("kernel", plan), plan)

    def local_lora(self, weights):
        """Inside the shard_map: ``(a, b, alpha / r)`` of this shard's LoRA factors, or None."""
        if "lora_kernel_a" not in weights:
            return None
        return weights["lora_kernel_a"], weights["lora_kernel_b"], self.lora_alpha / self.lora_rank

    def get_config(self):
        config = super().get_config()
        config.update(
            megatron_sp=self.megatron_sp, collective_matmul=self.collective_matmul, model_axis=self.model_axis
        )
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(renamed_keys(config, TENSOR_PARALLEL_KEYS))

    def describe_parallelism(self):
        """What a call runs under the current distribution, in words (``zoo.distribution.describe``)."""
        plan = tensor_parallel_plan(self.model_axis)
        if plan is None:
            return f"plain Dense, GSPMD (no {self.model_axis!r} axis to split over)"
        return describe_split(self.KIND, plan, self.collectives())


# --- LoRA, factored (module docstring) ----------------------------------------------------


def lora_update(x, a, b, *, scale):
    """(alpha / r) (x @ a) @ b for a Dense kernel's factors: x [..., C], a [C, r], b [r, F]
    -> [..., F], never forming the (C, F) update a @ b nor its gradient."""
    return keras.ops.matmul(keras.ops.matmul(x, a) * scale, b)  # [..., r] -> [..., F]


def einsum_lora_update(equation, x, a, b, *, scale):
    """The factored LoRA update of an ``EinsumDense`` of ``equation``: the equation with
    the kernel's last dimension (letter l) of size r, x @ a, then l contracted with b
    [r, size of l]; e.g. "btc,chd->bthd": (B, T, H, r) @ b (r, D) -> (B, T, H, D).
    None where l is not an output dimension (the merged kernel is then used)."""
    contraction = einsum_lora_contraction(equation)
    if contraction is None:
        return None
    low = keras.ops.einsum(equation, x, a) * scale  # the output with l of size r
    return keras.ops.matmul(low, b) if contraction == "matmul" else keras.ops.einsum(contraction, low, b)


def einsum_lora_contraction(equation):
    """How the factored update contracts r with b for ``equation``: "matmul" (the
    kernel's last letter is the output's last), an einsum, or None (it is no output letter)."""
    kernel, output = kernel_and_output_letters(equation)
    letter = kernel[-1:]
    if not letter.isalpha() or letter not in output:
        return None
    if output.endswith(letter):
        return "matmul"
    free = next(c for c in "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in equation)
    return f"{output},{letter}{free}->{output.replace(letter, free)}"


def factored_lora_call(layer, inputs, training=None):
    """``Dense.call`` / ``EinsumDense.call`` of a LoRA layer with the update factored:
    ``x @ kernel + (alpha / r) (x @ a) @ b`` (module docstring). Keras' own call where
    the layer is quantized (Keras already factors LoRA there) or its equation does not
    allow it; the bias and activation as Keras applies them."""
    kind = keras.layers.EinsumDense if isinstance(layer, keras.layers.EinsumDense) else keras.layers.Dense
    if not layer.lora_enabled or layer.quantization_mode is not None:
        return kind.call(layer, inputs, training=training)
    a, b, scale = layer.lora_kernel_a, layer.lora_kernel_b, layer.lora_alpha / layer.lora_rank
    kernel = kernel_variable(layer)  # the frozen kernel, not ``layer.kernel`` (merged)
    if kind is keras.layers.EinsumDense:
        update = einsum_lora_update(layer.equation, inputs, a, b, scale=scale)
        if update is None:
            return kind.call(layer, inputs, training=training)
        x = keras.ops.einsum(layer.equation, inputs, kernel) + update
    else:
        x = keras.ops.matmul(inputs, kernel) + lora_update(inputs, a, b, scale=scale)
    if layer.bias is not None:
        x = keras.ops.add(x, layer.bias)
    return x if layer.activation is None else layer.activation(x)


def column_lora(x, lora, *, axis_name, megatron_sp):
    """Inside a column-parallel shard_map: this shard's factored LoRA update.

    x [B, T, C] (Megatron SP: [B, T/N, C]), a [C, r] whole, b [r, F/N] -> [B, T, F/N].
    Sequence-parallel, the rank-r (x @ a) [B, T/N, r] is all-gathered over the sequence,
    not x (the main matmul gathers x itself); its transpose reduce-scatters r-wide."""
    a, b, scale = lora
    low = jnp.matmul(x, a) * scale  # [B, T(/N), r]
    if megatron_sp:
        low = jax.lax.all_gather(low, axis_name, axis=1, tiled=True)  # [B, T, r]
    return jnp.matmul(low, b)  # [B, T, F/N]


def row_matmul_with_lora(x, kernel, lora, *, axis_name, bias=None, megatron_sp=False, collective=False):
    """Row-parallel x [B, T, F/N] @ kernel [F/N, C] + (alpha / r) (x @ a) @ b, a [F/N, r]
    this shard's, b [r, C] whole -> [B, T, C] (Megatron SP: [B, T/N, C]).

    The update is added to this device's partial sum before the one all-reduce (SP:
    reduce-scatter), so LoRA adds no collective to the forward; with the overlapped
    ``collective`` kernel, which reduces x @ kernel alone, the rank-r (x @ a) is
    reduce-scattered by itself (B x T x r)."""
    a, b, scale = lora
    low = jnp.matmul(x, a) * scale  # [B, T, r], this shard's share of the sum
    if megatron_sp and collective:
        y = sequence_parallel_row_matmul(x, kernel, axis_name=axis_name, bias=bias, collective=True)  # [B, T/N, C]
        return y + jnp.matmul(jax.lax.psum_scatter(low, axis_name, scatter_dimension=1, tiled=True), b)
    partial = jnp.matmul(x, kernel) + jnp.matmul(low, b)  # [B, T, C], this device's share of the sum
    if megatron_sp:
        y = jax.lax.psum_scatter(partial, axis_name, scatter_dimension=1, tiled=True)  # [B, T/N, C]
    else:
        y = jax.lax.psum(partial, axis_name)  # [B, T, C]
    return y if bias is None else y + bias


def kernel_variable(layer):
    """The kernel variable of a ``Dense`` or ``EinsumDense`` layer (the zoo's TP layers
    too): its weight named ``kernel``. Once LoRA is enabled ``layer.kernel`` is the
    merged ``kernel + (alpha / r) a @ b``, not this variable."""
    kernels = [variable for variable in layer.weights if variable.name == "kernel"]
    if len(kernels) != 1:
        raise ValueError(f"layer {layer.name!r} has {len(kernels)} weights named 'kernel'; expected exactly one")
    return kernels[0]
