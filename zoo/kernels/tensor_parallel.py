"""Megatron tensor parallelism: dense layers whose weights are split over a mesh axis.

Call these inside ``jax.shard_map``; each sees one shard. Letters: B batch, T sequence,
C model width (the MLP's input and output features), F hidden (MLP) features, N size of
the mesh axis ``axis_name``. Global shapes are written ``[B, T, C]``, what one device
holds ``[B, T/N, C]`` or ``[C, F/N]``.

=============================  ===============  ===============  ===================
kernel                         x on one device  kernel           out on one device
=============================  ===============  ===============  ===================
column_parallel_matmul         [..., C]         [C, F/N]         [..., F/N]
row_parallel_matmul            [..., F/N]       [F/N, C]         [..., C] (psum)
  with scatter_axis=1          [B, T, F/N]      [F/N, C]         [B, T/N, C]
sequence_parallel_column_...   [B, T/N, C]      [C, F/N]         [B, T, F/N]
sequence_parallel_row_...      [B, T, F/N]      [F/N, C]         [B, T/N, C]
=============================  ===============  ===============  ===================

Paired as column -> row (Megatron's MLP) the hidden activation never leaves its device:
the forward needs one all-reduce of the ``[B, T, C]`` output (or, sequence-parallel,
one all-gather of the input and one reduce-scatter of the output: the same bytes), and
the backward the transposes: an all-reduce of d(input) (or a reduce-scatter of it and
an all-gather of d(output)). ``jax.shard_map`` inserts those backward collectives
itself: an input replicated over ``axis_name`` gets its cotangent summed.

An axis of one device: every collective these kernels call (all-gather, psum_scatter,
and psum of a value that does not vary over the axis) is skipped, since over one
device it would only copy; XLA keeps such collectives otherwise. The one exception is
the psum of a value that *varies* over a size-1 axis (a kernel whose spec names it):
JAX's types need the varying -> replicated step, which only a collective provides.
Leave size-1 axes out of the specs (the zoo's layers do) and none remains.
"""

import jax
import jax.numpy as jnp

from zoo.kernels.collective_matmul import _varying_axes, all_gather_matmul, matmul_reduce_scatter, vary_over

__all__ = [
    "check_divisible",
    "column_parallel_matmul",
    "dense_reference",
    "mlp_activation",
    "mlp_down_projection",
    "mlp_reference",
    "mlp_up_projections",
    "row_parallel_matmul",
    "sequence_parallel_column_matmul",
    "sequence_parallel_row_matmul",
    "tensor_parallel_mlp",
]


def check_divisible(size, *, axis_size, axis_name="model", what="features"):
    """Raises ``ValueError`` unless ``size`` splits evenly over the mesh axis."""
    if size % axis_size:
        raise ValueError(f"{what} {size} is not divisible by the {axis_name!r} mesh axis of size {axis_size}")


def dense_reference(x, kernel, *, bias=None):
    """Single-device dense layer: x [..., C] @ kernel [C, F] (+ bias [F]) -> [..., F]."""
    y = jnp.matmul(x, kernel)
    return y if bias is None else y + bias


@jax.custom_vjp
def _shard_matmul(x, kernel):
    """x [..., C] @ kernel [C, F] on one shard, with a backward whose weight gradient
    XLA:CPU can hand to its matmul library (see ``_shard_matmul_backward``)."""
    return jnp.matmul(x, kernel)


def _shard_matmul_forward(x, kernel):
    return jnp.matmul(x, kernel), (x, kernel)


def _shard_matmul_backward(residuals, dy):
    """d(x) = dy kernel^T and d(kernel) = x^T dy, the maths of JAX's own transpose.

    d(kernel) contracts x's and dy's leading dims, written as one ``tensordot`` over at
    least two of them (a 2-D x gets a leading dim of 1): XLA's dot canonicalisation
    then copies x^T into a row-major [C, N] that XLA:CPU's YNNPACK matmuls take in
    bfloat16. Two forms do not (JAX 0.12): JAX's transpose of a 2-D matmul, a dot
    contracting dim 0 of both operands, goes to the slow generic emitter (the
    tensor-parallel GPT step took 1.6x the fsdp step's time); a transpose of 2-D x
    arrives with a column-major layout that float normalisation refuses in bfloat16,
    so the dot ran in float32 (f32 [C, F/N] weight gradients, 45 ms against 25 ms
    for MaxText's bf16 ones; docs/performance.md). Each gradient is summed over the
    mesh axes it varies on and its primal does not (x replicated over ``model``, the
    kernel over ``data``), as shard_map's transpose would.
    """
    x, kernel = residuals
    dx = jnp.matmul(dy, kernel.T)  # [..., C]
    x_rows = x.reshape(1, -1, x.shape[-1])  # [1, N, C]: N = the leading dims
    dy_rows = dy.reshape(1, -1, dy.shape[-1])  # [1, N, F]
    dk = jnp.tensordot(x_rows, dy_rows, axes=((0, 1), (0, 1)))  # [C, F]
    return _summed_like(dx, x), _summed_like(dk, kernel).astype(kernel.dtype)


def _summed_like(gradient, primal):
    """``gradient`` summed over the mesh axes it varies on and ``primal`` does not."""
    extra = tuple(sorted(_varying_axes(gradient) - _varying_axes(primal)))
    return jax.lax.psum(gradient, extra) if extra else gradient


_shard_matmul.defvjp(_shard_matmul_forward, _shard_matmul_backward)


def column_parallel_matmul(x, kernel, *, axis_name, bias=None):
    """Column-parallel dense: the kernel is split on its output features.

    Global: x [..., C] @ kernel [C, F] -> [..., F]. One device: x [..., C] (the whole
    input, replicated over ``axis_name``), kernel [C, F/N], bias [F/N] -> [..., F/N],
    its own slice of the output features. No communication forward; the backward
    all-reduces d(x) over ``axis_name`` (shard_map does it: x is replicated).
    """
    _check_kernel(x, kernel, axis_name=axis_name, split="output")
    y = _shard_matmul(x, kernel)
    return y if bias is None else y + bias  # [..., F/N]


def row_parallel_matmul(x, kernel, *, axis_name, bias=None, scatter_axis=None):
    """Row-parallel dense: the kernel is split on its input features.

    Global: x [..., F] @ kernel [F, C] -> [..., C]. One device: x [..., F/N] (its
    slice of the input features, e.g. a column-parallel output), kernel [F/N, C]
    -> a partial sum [..., C], summed over ``axis_name``:

    - ``scatter_axis=None``: ``psum`` (all-reduce); every device gets [..., C].
    - ``scatter_axis=k``: ``psum_scatter`` (reduce-scatter) along dimension k; each
      device gets 1/N of it, e.g. [B, T/N, C] for k = 1 (sequence parallelism).

    The bias [C] (replicated) is added once, after the reduction.
    """
    _check_kernel(x, kernel, axis_name=axis_name, split="input")
    partial = _shard_matmul(x, kernel)  # [..., C], this device's share of the sum
    if scatter_axis is None:
        y = _psum(partial, axis_name)  # [..., C]
    else:
        y = _psum_scatter(partial, axis_name, scatter_axis)  # [B, T/N, C]
    return y if bias is None else y + bias


def _single_device(axis_name):
    """True when ``axis_name`` has one device: a collective over it would only copy."""
    return jax.lax.axis_size(axis_name) == 1


def _psum(x, axis_name):
    """``psum`` over ``axis_name``, skipped over one device unless x varies over it (see the module doc)."""
    if _single_device(axis_name) and axis_name not in _varying_axes(x):
        return x
    return jax.lax.psum(x, axis_name)


def _psum_scatter(x, axis_name, dimension):
    """Tiled ``psum_scatter`` along ``dimension``; the identity over one device."""
    if _single_device(axis_name):
        return x
    return jax.lax.psum_scatter(x, axis_name, scatter_dimension=dimension, tiled=True)


def _all_gather(x, axis_name, dimension):
    """Tiled ``all_gather`` along ``dimension``; the identity over one device."""
    if _single_device(axis_name):
        return x
    return jax.lax.all_gather(x, axis_name, axis=dimension, tiled=True)


def sequence_parallel_column_matmul(x, kernel, *, axis_name, sequence_axis=1, bias=None, collective=False):
    """Sequence-parallel column dense: all-gather the sequence, then ``column_parallel_matmul``.

    Global: x [B, T, C] @ kernel [C, F] -> [B, T, F]. One device: x [B, T/N, C] (its
    slice of the sequence), kernel [C, F/N] -> [B, T, F/N]. Forward: one all-gather of
    x over ``axis_name``; backward: its transpose, a reduce-scatter of d(x).

    ``collective=True`` overlaps the all-gather with the matmul in N chunks
    (``collective_matmul.all_gather_matmul``): same result, N - 1 ``ppermute`` hops
    instead of one all-gather.
    """
    _check_kernel(x, kernel, axis_name=axis_name, split="output")
    if collective:
        y = all_gather_matmul(x, kernel, axis_name=axis_name, axis=sequence_axis)  # [B, T, F/N]
        return y if bias is None else y + bias
    x_all = _all_gather(x, axis_name, sequence_axis)  # [B, T, C]
    return dense_reference(x_all, kernel, bias=bias)  # [B, T, F/N]


def sequence_parallel_row_matmul(x, kernel, *, axis_name, sequence_axis=1, bias=None, collective=False):
    """Sequence-parallel row dense: ``row_parallel_matmul`` reduce-scattered over the sequence.

    Global: x [B, T, F] @ kernel [F, C] -> [B, T, C]. One device: x [B, T, F/N],
    kernel [F/N, C] -> [B, T/N, C]. Forward: one reduce-scatter; backward: its
    transpose, an all-gather of d(out). ``collective=True`` overlaps the
    reduce-scatter with the matmul (``collective_matmul.matmul_reduce_scatter``).
    """
    if not collective:
        return row_parallel_matmul(x, kernel, axis_name=axis_name, bias=bias, scatter_axis=sequence_axis)
    _check_kernel(x, kernel, axis_name=axis_name, split="input")
    y = matmul_reduce_scatter(x, kernel, axis_name=axis_name, axis=sequence_axis)  # [B, T/N, C]
    return y if bias is None else y + bias


def tensor_parallel_mlp(
    x,
    *,
    up_kernel,
    down_kernel,
    activation,
    axis_name,
    gate_kernel=None,
    up_bias=None,
    gate_bias=None,
    down_bias=None,
    megatron_sp=False,
    collective=False,
    sequence_axis=1,
):
    """Megatron MLP on one shard: column-parallel up (and gate), row-parallel down.

    Global: x [B, T, C]; up/gate kernels [C, F]; down kernel [F, C]; out [B, T, C]:
    ``down(activation(x @ up))``, or gated ``down(activation(x @ gate) * (x @ up))``.
    One device holds up/gate [C, F/N] (+ bias [F/N]), down [F/N, C] (+ bias [C]) and
    the hidden activation [B, T, F/N]: it never moves.

    - ``megatron_sp=False``: x [B, T, C] -> [B, T, C]; one all-reduce forward.
    - ``megatron_sp=True``: x [B, T/N, C] -> [B, T/N, C]; one all-gather of x
      (shared by up and gate) and one reduce-scatter forward. With ``collective``
      both are overlapped with the matmuls (``collective_matmul``).

    ``activation`` is a function of one array (e.g. ``jax.nn.gelu``). It runs here on
    the per-shard hidden values, varying over the mesh: on JAX 0.12 the derivative of
    the erf family (exact GELU, ``lax.erf``/``erfc``) cannot be traced there (see
    ``mlp_activation``). The same maths in three steps, the activation outside the
    ``shard_map``: ``mlp_up_projections``, ``mlp_activation``, ``mlp_down_projection``.
    """
    hidden = mlp_up_projections(
        x,
        up_kernel=up_kernel,
        gate_kernel=gate_kernel,
        up_bias=up_bias,
        gate_bias=gate_bias,
        axis_name=axis_name,
        megatron_sp=megatron_sp,
        collective=collective,
        sequence_axis=sequence_axis,
    )  # [B, T, F/N] each
    h = mlp_activation(hidden, activation=activation)  # [B, T, F/N]
    return mlp_down_projection(
        h,
        down_kernel=down_kernel,
        down_bias=down_bias,
        axis_name=axis_name,
        megatron_sp=megatron_sp,
        collective=collective,
        sequence_axis=sequence_axis,
    )  # [B, T/N, C] or [B, T, C]


def mlp_up_projections(
    x,
    *,
    up_kernel,
    axis_name,
    gate_kernel=None,
    up_bias=None,
    gate_bias=None,
    megatron_sp=False,
    collective=False,
    sequence_axis=1,
):
    """The column-parallel half of ``tensor_parallel_mlp`` on one shard: ``[up]`` or ``[gate, up]``.

    x [B, T, C] (or, sequence-parallel, [B, T/N, C]) -> a list of [B, T, F/N], this
    device's hidden features; the projections share one all-gather of x (sequence
    parallel) or one varying cast of x (one all-reduce of d(x) in the backward).
    """
    if collective and not megatron_sp:
        raise ValueError("collective matmul overlaps the sequence all-gather: it needs megatron_sp=True")
    kernels = [up_kernel] if gate_kernel is None else [gate_kernel, up_kernel]
    biases = [up_bias] if gate_kernel is None else [gate_bias, up_bias]
    return _up_projections(x, kernels, biases, axis_name, megatron_sp, collective, sequence_axis)


def mlp_activation(hidden, *, activation):
    """``activation(up)``, or gated ``activation(gate) * up``, of ``mlp_up_projections``' list.

    Elementwise, so it needs no communication and may run inside the ``shard_map`` on
    [B, T, F/N] or outside it on the global [B, T, F] split over the features. Outside
    is what works for every activation: JAX 0.12's derivatives of ``lax.erf``/``erfc``
    (exact GELU) call ``lax.polynomial``, whose constant coefficients are not cast to
    the varying manual axes of a ``shard_map`` value ("Primitive polynomial requires
    varying manual axes to match").
    """
    if len(hidden) == 1:
        return activation(hidden[0])
    gate, up = hidden
    return activation(gate) * up


def mlp_down_projection(
    h, *, down_kernel, axis_name, down_bias=None, megatron_sp=False, collective=False, sequence_axis=1
):
    """The row-parallel half of ``tensor_parallel_mlp`` on one shard.

    h [B, T, F/N] -> [B, T, C] (one all-reduce) or, sequence-parallel, [B, T/N, C]
    (one reduce-scatter, overlapped with the matmul when ``collective``).
    """
    if megatron_sp:
        return sequence_parallel_row_matmul(
            h, down_kernel, axis_name=axis_name, sequence_axis=sequence_axis, bias=down_bias, collective=collective
        )  # [B, T/N, C]
    if collective:
        raise ValueError("collective matmul overlaps the sequence reduce-scatter: it needs megatron_sp=True")
    return row_parallel_matmul(h, down_kernel, axis_name=axis_name, bias=down_bias)  # [B, T, C]


def _up_projections(x, kernels, biases, axis_name, megatron_sp, collective, sequence_axis):
    """x @ each kernel, all sharing one all-gather of x in sequence-parallel mode."""
    if not megatron_sp:
        if not _single_device(axis_name):  # over one device the cast's transpose would be a psum of one
            x = vary_over(x, axis_name)  # one cast: the backward all-reduces d(x) once, not per kernel
        return [column_parallel_matmul(x, k, axis_name=axis_name, bias=b) for k, b in zip(kernels, biases)]
    if collective:
        # One overlapped gather for all: n kernels [C, F/N] side by side -> [C, n F/N].
        joined = jnp.concatenate(kernels, axis=-1)
        y = all_gather_matmul(x, joined, axis_name=axis_name, axis=sequence_axis)  # [B, T, n F/N]
        parts = jnp.split(y, len(kernels), axis=-1)
        return [p if b is None else p + b for p, b in zip(parts, biases)]
    x_all = _all_gather(x, axis_name, sequence_axis)  # [B, T, C]
    return [dense_reference(x_all, k, bias=b) for k, b in zip(kernels, biases)]


def mlp_reference(
    x, *, up_kernel, down_kernel, activation, gate_kernel=None, up_bias=None, gate_bias=None, down_bias=None
):
    """Single-device MLP with the maths of ``tensor_parallel_mlp``: x [..., C] -> [..., C]."""
    up = dense_reference(x, up_kernel, bias=up_bias)  # [..., F]
    h = activation(up) if gate_kernel is None else activation(dense_reference(x, gate_kernel, bias=gate_bias)) * up
    return dense_reference(h, down_kernel, bias=down_bias)  # [..., C]


def _check_kernel(x, kernel, *, axis_name, split):
    """Per-shard shapes: x's last dim feeds the kernel; names the global sizes on a mismatch."""
    if kernel.ndim != 2:
        raise ValueError(f"kernel must be 2-D [in, out], got shape {tuple(kernel.shape)}")
    if x.shape[-1] != kernel.shape[0]:
        n = jax.lax.axis_size(axis_name)
        detail = f" (the kernel is split on its {split} features over the {axis_name!r} axis of size {n})"
        raise ValueError(
            f"input features {x.shape[-1]} on this shard do not match the kernel shard {tuple(kernel.shape)}{detail}"
        )
