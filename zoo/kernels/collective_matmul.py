"""Collective matmuls: the sequence all-gather / reduce-scatter overlapped with the matmul.

An all-gather followed by a matmul makes the matmul wait for the whole gather. Cut
the sequence into the N shards the devices already hold and pass them around a ring
with ``ppermute``: while shard s travels to the next device, the matmul of shard s - 1
runs. N matmuls of [B, T/N, C] x [C, F/N] and N - 1 hops of [B, T/N, C] replace one
all-gather of [B, T, C] and one matmul; the bytes each device sends are the same,
(N - 1)/N of [B, T, C] (the pattern of the JAX shard_map docs and the scaling book).
The reduce-scatter after a row-parallel matmul is overlapped the same way, with a
travelling accumulator instead of a travelling input.

Letters as in ``tensor_parallel``: B batch, T sequence, C model width, F hidden (MLP)
features, N size of the mesh axis ``axis_name``.
The hops go one way (i -> i + 1); a bidirectional ring would halve the latency. Over an
axis of one device there is no hop: the ring makes N - 1 = 0 of them (no self
``ppermute``), and the result is the plain matmul.
"""

import jax
import jax.numpy as jnp

__all__ = ["all_gather_matmul", "matmul_reduce_scatter"]


def _varying_axes(x):
    """Mesh axes over which ``x`` differs between devices (shard_map's varying-axes type)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(vma)


def _vary_like(kernel, x):
    """``kernel`` marked as varying over x's axes, once.

    A kernel replicated over an axis that x is split over (the batch over ``data``)
    would otherwise be cast to varying at each of its N uses, and the backward would
    all-reduce N partial weight gradients instead of their sum.
    """
    return vary_over(kernel, _varying_axes(x))


def vary_over(x, axis_names):
    """``x`` cast to varying over ``axis_names`` (those it does not vary over yet).

    Every use of a replicated array in an expression with a varying one casts it; the
    backward sums the cotangent of each cast separately. Casting once, before an array
    is used several times, makes that one all-reduce of the summed cotangent.
    """
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    missing = tuple(sorted(set(axis_names) - _varying_axes(x)))
    if not missing:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)  # JAX before pcast


def _ring(axis_name):
    n = jax.lax.axis_size(axis_name)
    return n, jax.lax.axis_index(axis_name), [(i, (i + 1) % n) for i in range(n)]


def all_gather_matmul(x, kernel, *, axis_name, axis=1):
    """``all_gather(x, axis) @ kernel`` with the gather overlapped; inside ``shard_map``.

    One device: x [B, T/N, C] (its sequence shard, the sequence at dimension
    ``axis``), kernel [C, F/N] -> [B, T, F/N], identical to
    ``jnp.matmul(jax.lax.all_gather(x, axis_name, axis=axis, tiled=True), kernel)``.

    Step s (0 <= s < N): device i holds the shard of device (i - s) mod N, sends it on
    to device i + 1, multiplies it and writes rows (i - s) mod N of the output.
    """
    n, me, right = _ring(axis_name)
    kernel = _vary_like(kernel, x)
    chunk = x.shape[axis]
    out_shape = x.shape[:axis] + (n * chunk,) + x.shape[axis + 1 : -1] + (kernel.shape[-1],)
    out = jnp.zeros(out_shape, jnp.result_type(x, kernel))  # [B, T, F/N]
    block = x  # [B, T/N, C], the shard of device (me - step) mod N
    for step in range(n):
        incoming = jax.lax.ppermute(block, axis_name, right) if step < n - 1 else None
        y = jnp.matmul(block, kernel)  # [B, T/N, F/N]; overlaps the ppermute above
        out = jax.lax.dynamic_update_slice_in_dim(out, y, ((me - step) % n) * chunk, axis)
        block = incoming
    return out


def matmul_reduce_scatter(x, kernel, *, axis_name, axis=1):
    """``psum_scatter(x @ kernel, scatter_dimension=axis)`` overlapped; inside ``shard_map``.

    One device: x [B, T, F/N] (its slice of the hidden features), kernel [F/N, C]
    -> [B, T/N, C], its sequence shard of the sum over devices, identical to
    ``jax.lax.psum_scatter(x @ kernel, axis_name, scatter_dimension=axis, tiled=True)``.

    An accumulator for each output shard travels the ring: at step s device i adds its
    partial product for rows (i - 1 - s) mod N and passes the sum to device i + 1; after
    N - 1 hops the accumulator for rows i, complete, rests on device i.
    """
    n, me, right = _ring(axis_name)
    kernel = _vary_like(kernel, x)
    length = x.shape[axis]
    if length % n:
        raise ValueError(f"sequence length {length} is not divisible by the {axis_name!r} mesh axis of size {n}")
    chunk = length // n
    acc = None  # [B, T/N, C]
    for step in range(n):
        rows = jax.lax.dynamic_slice_in_dim(x, ((me - 1 - step) % n) * chunk, chunk, axis)  # [B, T/N, F/N]
        part = jnp.matmul(rows, kernel)  # [B, T/N, C]; overlaps the hop of the previous sum
        acc = part if acc is None else acc + part
        if step < n - 1:
            acc = jax.lax.ppermute(acc, axis_name, right)
    return acc
