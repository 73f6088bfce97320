"""Megatron tensor-parallel self-attention: one ``shard_map`` from x to the attention output.

``MultiHeadAttention`` takes this path when its plan (``zoo.layers._parallel_plan``)
splits its model axis over N > 1 devices and has no sequence axis (no ``ContextParallel``
sequence axis of size > 1, no axis of size > 1 named by the layer's ``sequence_axis``);
otherwise its projections run as ordinary ``EinsumDense`` layers (GSPMD).

One device, letters as in ``docs/architecture.md`` (B batch, T sequence, C model
width, H query heads, K KV heads, D head_dim, N the model axis' size, Nd the batch
axis' size):

=================================  =========================  ==============================
step                               shapes on one device       communication over ``model``
=================================  =========================  ==============================
x                                  f32[B/Nd, T, C]            none (replicated)
  (Megatron SP) x                  f32[B/Nd, T/N, C]          all-gather (T/N -> T)
q = x @ query (column-parallel)    f32[B/Nd, T, H/N, D]       none
k, v = x @ key, value              f32[B/Nd, T, K/N or 1, D]  none
  (qk_norm) RMSNorm over D of q, k  the same                   none (scales (D,) replicated)
attention (``plain_attention``)    f32[B/Nd, T, H/N, D]       none
out = attention @ output (row)     f32[B/Nd, T, C] partial    psum (all-reduce)
  (Megatron SP) out                f32[B/Nd, T/N, C]          psum_scatter (reduce-scatter)
=================================  =========================  ==============================

The backward is the transpose: ONE all-reduce of d(x) (x is cast to varying once, so
the q, k and v input gradients are summed on the device before a single collective),
or, sequence-parallel, one reduce-scatter of d(x) and one all-gather of d(out). That is
Megatron's minimum: two (B/Nd, T, C) all-reduces per attention block per step.

KV heads: with K % N == 0 each device holds K/N KV heads. With fewer KV heads than the
model axis (K < N, N % K == 0: Megatron's rule) the key and value kernels are
replicated over ``model`` and each device slices out the one KV head its H/N query
heads use (query head h uses KV head h // (H/K); device m's heads all use KV head
m // (N/K)); their gradients are summed over ``model`` (an all-reduce of the C x K x D
kernel, not of an activation). Neither dividing the other is an error naming both.

Weights are created with their layouts (``AttentionProjection.add_weight``), as the
tensor-parallel Dense layers do: (C, H, D) query kernels (-, model, -); (H, D, C)
output kernels (model, -, -); under a ``weight_shard_axis`` (``fsdp+tp``: data) also
split on C over it, all-gathered inside the ``shard_map`` just in time.
"""

import jax
import jax.numpy as jnp
import keras
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from zoo.config.choices import ATTENTION_QKV, LORA_WEIGHTS
from zoo.distribution.axes import MODEL
from zoo.kernels.collective_matmul import vary_over
from zoo.layers import _sequence_parallel
from zoo.layers._parallel_plan import run_sharded
from zoo.layers._quantized import QUANTIZED_PARTS, quantized_axes, quantized_mode, quantized_parts
from zoo.layers._tensor_parallel import (
    WeightsPlacedAtCreation,
    activation_spec,
    axis_sizes,
    check_input,
    describe_split,
    gather_weight,
    kernel_variable,
    local_quantized_kernel,
    quantize_layer,
    quantized_build,
)

# Which dimension of each weight holds the heads (split over model), and which holds C
# (split over the weight-shard axis under FSDP inside TP), per projection role.
HEAD_DIMS = {
    "heads_out": {"kernel": 1, "bias": 0, "lora_kernel_a": 1},  # query/key/value: kernel (C, H|K, D), bias (H|K, D)
    "heads_in": {"kernel": 0, "lora_kernel_a": 0},  # output: kernel (H, D, C), bias (C,)
}
CHANNEL_DIMS = {"heads_out": {"kernel": 0}, "heads_in": {"kernel": 2}}


def kv_heads_replicated(num_kv_heads, model_size):
    """True when the KV heads are replicated over the model axis (K < N, N % K == 0)."""
    return num_kv_heads % model_size != 0


def check_heads(where, plan, *, num_heads, num_kv_heads, channels):
    """Raise, naming the numbers, unless the heads (and C, under FSDP) split over the plan's axes."""
    m, axis = plan.model_size, plan.model_axis
    if num_heads % m:
        raise ValueError(f"{where}: num_heads {num_heads} is not divisible by the {axis!r} mesh axis of size {m}")
    if num_kv_heads % m and m % num_kv_heads:
        raise ValueError(
            f"{where}: num_kv_heads {num_kv_heads} and the {axis!r} mesh axis of size {m} do not divide each "
            f"other; tensor parallelism splits the KV heads over the axis when {m} divides them, or replicates "
            f"them when {num_kv_heads} divides {m}"
        )
    if plan.weight_shard_axis is not None and channels % plan.weight_shard_size:
        raise ValueError(
            f"{where}: channels {channels} is not divisible by the {plan.weight_shard_axis!r} mesh axis of size "
            f"{plan.weight_shard_size} (the projections are also split FSDP-style over it)"
        )


class AttentionProjection(WeightsPlacedAtCreation, keras.layers.EinsumDense):
    """An ``EinsumDense`` whose weights are created with their tensor-parallel layouts.

    ``role``: ``"heads_out"`` (query/key/value: heads on the output side) or
    ``"heads_in"`` (output: heads on the input side). Under a plan the heads dimension
    is split over the model axis (or replicated when the heads do not divide by it:
    KV heads fewer than the axis), and C over the plan's weight-shard axis; LoRA factors
    follow the heads split only. Outside a plan it is a plain ``EinsumDense``.
    """

    def __init__(self, *args, role, model_axis=MODEL, **kwargs):
        super().__init__(*args, **kwargs)
        self.role = role
        self.model_axis = model_axis

    def weight_axes(self, name, shape, plan):
        """Layout axes of weight ``name`` of ``shape`` under ``plan`` (None: not ours); a
        quantized weight's follow the float kernel's (``zoo.layers._quantized.quantized_axes``)."""
        if name in QUANTIZED_PARTS and quantized_mode(self) is not None:
            float_shape = self.quantized_kernel_shape
            kernel_axes = self.float_axes("kernel", float_shape, plan)
            return quantized_axes(self, name, shape, float_shape, kernel_axes, axis_sizes(plan))
        return self.float_axes(name, shape, plan)

    def float_axes(self, name, shape, plan):
        """Layout axes of float weight ``name`` of ``shape`` under ``plan`` (None: not ours)."""
        if name not in ("kernel", "bias", *LORA_WEIGHTS):
            return None
        axes = [None] * len(shape)
        head = HEAD_DIMS[self.role].get(name)
        if head is not None and shape[head] % plan.model_size == 0:
            axes[head] = plan.model_axis
        channel = CHANNEL_DIMS[self.role].get(name)
        if channel is not None and plan.weight_shard_axis is not None:
            axes[channel] = plan.weight_shard_axis
        return tuple(axes)

    creation_axes = weight_axes  # WeightsPlacedAtCreation.add_weight places them

    def get_config(self):
        return {**super().get_config(), "role": self.role, "model_axis": self.model_axis}

    def quantize(self, mode=None, **kwargs):
        quantize_layer(self, keras.layers.EinsumDense, mode, **kwargs)

    def quantized_build(self, kernel_shape, mode, config=None):
        quantized_build(self, keras.layers.EinsumDense, kernel_shape, mode, config)

    def sharded_weights(self, plan):
        """``({name: array}, {name: PartitionSpec})`` of the weights the shard body needs."""
        variables = {"kernel": kernel_variable(self), "bias": self.bias}
        variables.update({n: getattr(self, n) for n in quantized_parts(self)[1:]})
        if self.lora_enabled:
            variables.update(lora_kernel_a=self.lora_kernel_a, lora_kernel_b=self.lora_kernel_b)
        variables = {n: v for n, v in variables.items() if v is not None}
        specs = {n: P(*self.weight_axes(n, v.shape, plan)) for n, v in variables.items()}
        return {n: v.value for n, v in variables.items()}, specs

    def local_kernel(self, weights, plan):
        """Inside the shard_map: this device's (frozen, under LoRA) kernel, gathered over the
        weight-shard axis if split over it; the LoRA update is applied factored (``local_lora``).
        A quantized kernel's shard is dequantized here (``local_quantized_kernel``)."""
        if quantized_mode(self) is not None:
            float_shape = self.quantized_kernel_shape
            shapes = {v.name: v.shape for v in self.weights}  # whole, not this shard's
            axes_of = lambda name: self.weight_axes(name, shapes[name], plan)  # noqa: E731
            return local_quantized_kernel(self, weights, plan, axes_of, self.float_axes("kernel", float_shape, plan))
        kernel = weights["kernel"]
        return gather_weight(kernel, self.weight_axes("kernel", kernel_variable(self).shape, plan), plan)

    def local_lora(self, weights):
        """Inside the shard_map: ``(a, b, alpha / r)`` of this device's LoRA factors, or None."""
        if "lora_kernel_a" not in weights:
            return None
        return weights["lora_kernel_a"], weights["lora_kernel_b"], self.lora_alpha / self.lora_rank


def takes_this_path(plan):
    """Whether an attention layer with this plan runs as one tensor-parallel ``shard_map``:
    a model axis splits, and no sequence axis (the layer's or a ``ContextParallel``'s)."""
    return plan.tensor_parallel and plan.sequence_axis is None


def describe(layer, plan):
    """What this path runs for ``layer`` under ``plan``, in words."""
    heads = f"{layer.num_heads // plan.model_size} of {layer.num_heads} heads per device"
    if layer.megatron_sp:
        collectives = "one all-gather and one reduce-scatter over the sequence per call"
    else:
        collectives = "one all-reduce of the output per call (one of d(x) backward)"
    return describe_split("tensor-parallel attention", plan, f"{heads}, {collectives}")


def attention(layer, plan, x, key_mask, segment_ids=None):
    """``layer``'s attention output (B, T, C) for x (B, T, C) (Megatron SP: both split on T);
    key_mask bool (B, T) and segment_ids i32 (B, T) (packing) or None, whole on the model axis."""
    sequence = layer.megatron_sp
    check_input(layer, plan, x.shape, sequence=sequence)
    projections = (layer.query, layer.key, layer.value, layer.output_dense)
    weights, specs = zip(*(p.sharded_weights(plan) for p in projections))
    x_spec = activation_spec(plan, 3, sequence=sequence)  # (B/Nd, T[/N], C)
    mask_spec = None if key_mask is None else P(plan.batch_axis, None)  # bool (B/Nd, T)
    ids_spec = None if segment_ids is None else P(plan.batch_axis, None)  # i32 (B/Nd, T)
    norms = qk_norm_scales(layer)  # {"query": f32[D], "key": f32[D]} or {}: whole on every device
    args = (x, key_mask, segment_ids, list(weights), norms)
    in_specs = (x_spec, mask_spec, ids_spec, list(specs), {name: P() for name in norms})
    return run_sharded(plan, _local_attention, args, in_specs, x_spec, layer=layer, plan=plan)


def qk_norm_scales(layer):
    """The qk-norm scales of ``layer`` as arrays (``{}`` without ``qk_norm``)."""
    if not layer.qk_norm:
        return {}
    scales = {"query": layer.query_norm.scale.value, "key": layer.key_norm.scale.value}
    if layer.qk_norm_offset:  # OffsetRMSNormalization: 1 + scale, in float32
        return {name: 1.0 + scale.astype("float32") for name, scale in scales.items()}
    return scales


def _normalize(layer, x, scale):
    """qk-norm of one device's heads x f32[B/Nd, T, heads, D], as ``RMSNormalization`` computes it."""
    if layer.qk_norm_offset:  # as OffsetRMSNormalization: in float32, then the compute dtype
        y = keras.ops.rms_normalization(x.astype("float32"), scale=scale, axis=-1, epsilon=layer.qk_norm_epsilon)
        return y.astype(x.dtype)
    return keras.ops.rms_normalization(x, scale=scale.astype(x.dtype), axis=-1, epsilon=layer.qk_norm_epsilon)


def _local_attention(x, key_mask, segment_ids, weights, norms, *, layer, plan):
    """One device: x f32[B/Nd, T, C] (Megatron SP: f32[B/Nd, T/N, C]) -> the same shape;
    key_mask bool[B/Nd, T], segment_ids i32[B/Nd, T] or None (all T tokens' ids)."""
    axis = plan.model_axis
    if layer.megatron_sp:
        x = jax.lax.all_gather(x, axis, axis=1, tiled=True)  # f32[B/Nd, T, C]; backward: one reduce-scatter
    else:
        x = vary_over(x, axis)  # one cast: the backward sums d(x) of q, k, v here, then all-reduces once
    query, key, value, output = weights
    q = _project(layer.query, x, query, plan)  # f32[B/Nd, T, H/N, D]
    k = _project(layer.key, x, key, plan, kv=layer.num_kv_heads)  # f32[B/Nd, T, K/N or 1, D]
    v = _project(layer.value, x, value, plan, kv=layer.num_kv_heads)  # f32[B/Nd, T, K/N or 1, D]
    if norms:  # per head: each device normalises its own heads
        q, k = _normalize(layer, q, norms["query"]), _normalize(layer, k, norms["key"])
    q, k, v = (checkpoint_name(t, ATTENTION_QKV) for t in (q, k, v))  # what remat save_attention keeps
    out = _sequence_parallel.plain_attention(
        q,
        k,
        v,
        spec=layer.attention_spec,
        key_mask=key_mask,
        balance=None,
        rope=layer.rope,
        axis_size=1,
        axis_name=None,
        segment_ids=segment_ids,
    )  # f32[B/Nd, T, H/N, D]
    kernel = layer.output_dense.local_kernel(output, plan)  # f32[H/N, D, C]
    partial = jnp.einsum("bthd,hdc->btc", out, kernel)  # f32[B/Nd, T, C], this device's heads' share
    lora = layer.output_dense.local_lora(output)  # a f32[H/N, D, r], b f32[r, C]
    if lora is not None:  # factored, summed with the heads' shares: no extra collective
        a, b, scale = lora
        partial = partial + jnp.matmul(jnp.einsum("bthd,hdr->btr", out, a) * scale, b)
    if layer.megatron_sp:
        y = jax.lax.psum_scatter(partial, axis, scatter_dimension=1, tiled=True)  # f32[B/Nd, T/N, C]
    else:
        y = jax.lax.psum(partial, axis)  # f32[B/Nd, T, C]
    return y if "bias" not in output else y + output["bias"]


def _project(projection, x, weights, plan, kv=None):
    """x f32[B/Nd, T, C] @ this device's heads of ``projection`` -> f32[B/Nd, T, heads, D].

    ``kv``: the KV head count, for key/value: when replicated over the model axis each
    device slices out the one KV head its query heads use."""
    kernel = projection.local_kernel(weights, plan)  # f32[C, heads, D]
    lora = projection.local_lora(weights)  # a f32[C, heads, r], b f32[r, D], or None
    bias = weights.get("bias")  # f32[heads, D] or None
    if kv is not None and kv_heads_replicated(kv, plan.model_size):
        index = jax.lax.axis_index(plan.model_axis) // (plan.model_size // kv)  # this device's KV head
        kernel = jax.lax.dynamic_slice_in_dim(kernel, index, 1, axis=1)  # f32[C, 1, D]
        bias = None if bias is None else jax.lax.dynamic_slice_in_dim(bias, index, 1, axis=0)  # f32[1, D]
        if lora is not None:
            lora = (jax.lax.dynamic_slice_in_dim(lora[0], index, 1, axis=1), *lora[1:])  # a f32[C, 1, r]
    y = jnp.einsum("btc,chd->bthd", x, kernel)
    if lora is not None:  # factored: (x a) b, no (C, heads, D) update or gradient
        a, b, scale = lora
        y = y + jnp.matmul(jnp.einsum("btc,chr->bthr", x, a) * scale, b)
    return y if bias is None else y + bias
