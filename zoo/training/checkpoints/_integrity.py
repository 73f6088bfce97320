"""Checksums of a checkpoint's arrays, and the finiteness check, computed shard by shard.

Each array's checksum is two 32-bit sums over its bits, taken as 32-bit words ``w_i``
(16- and 8-bit types widened, 64-bit ones split in two), ``i`` being the word's row-major
position in the whole array:

    sum_i w_i * (2i + 1)   and   sum_i (w_i XOR i * 0x9E3779B9) * 0x01000193   (mod 2**32)

A change of any one word changes both (an odd factor times a nonzero change is nonzero
modulo 2**32); other damage goes unnoticed with odds of about 2**-64. Integer addition
does not depend on order, so the sums are the same for any sharding or device count: a
checkpoint saved on 8 devices verifies when restored on 1.

How they are computed: one small jitted program per *shard*, on the shard's own device,
with the shard's offset in the whole array as an argument; the host adds the partial sums
of each array's first replica of every shard (and, with several processes, gathers them
once). No program has a collective, and nothing is gathered to one device. Two reasons:

- a program over a sharded array all-reduces; dozens of such small programs in flight at
  once deadlocked XLA:CPU's in-process collectives (a rendezvous with 3 of 4 devices,
  then an abort after 120 s), one run in four of the checkpoint tests;
- XLA:CPU materialises the products before summing them: one program over gpt_1b's whole
  state (11.6 GiB over 8 devices) took 2.96 GiB of temporaries per device; one shard at
  a time takes at most twice the largest shard.
"""

import jax
import jax.numpy as jnp
import numpy as np

from zoo.training.checkpoints._state import GROUPS  # the two lists of the array tree

MASK = 2**32 - 1


def checksums(tree):
    """``{"model": [hex], "optimizer": [hex]}``: each array's 64-bit checksum (see above)."""
    arrays = [array for group in GROUPS for array in tree[group]]
    partial = [_dispatch_partial_sums(array) for array in arrays]  # all dispatched before any is fetched
    totals = np.array([_add(jax.device_get(sums)) for sums in partial], dtype=np.uint64).reshape(-1, 2)
    totals = _across_processes(totals)
    hexes = [f"{int(a):08x}{int(b):08x}" for a, b in totals]
    counts = [len(tree[group]) for group in GROUPS]
    return {"model": hexes[: counts[0]], "optimizer": hexes[counts[0] :]}


def first_non_finite(tree):
    """``(group, index)`` of the first floating-point array holding a NaN or an infinity, or None."""
    floating = [
        (group, index, array)
        for group in GROUPS
        for index, array in enumerate(tree[group])
        if jnp.issubdtype(array.dtype, jnp.inexact)
    ]
    checks = [[_all_finite(shard.data) for shard in array.addressable_shards] for _, _, array in floating]
    finite = np.array([all(bool(ok) for ok in jax.device_get(each)) for each in checks])
    finite = _all_processes(finite)
    return next(((group, index) for (group, index, _), ok in zip(floating, finite) if not ok), None)


def _dispatch_partial_sums(array):
    """``[(first, second)]`` device scalars, one pair per first-replica shard of ``array`` here."""
    shape = tuple(array.shape) + ((2,) if array.dtype.itemsize == 8 else ())
    sums = []
    for shard in array.addressable_shards:
        if shard.replica_id != 0:
            continue
        start = [index.start or 0 for index in _slices(shard.index, array.ndim)] + (
            [0] if len(shape) > array.ndim else []
        )
        sums.append(_shard_sums(shard.data, np.array(start, dtype=np.uint32), _strides(shape)))
    return sums


def _strides(shape):
    """``uint32[ndim]``: row-major strides of ``shape`` in words, modulo 2**32."""
    strides, stride = [], 1
    for size in reversed(shape):
        strides.append(stride & MASK)
        stride *= size
    return np.array(strides[::-1], dtype=np.uint32)


def _slices(index, ndim):
    return tuple(index) + (slice(None),) * (ndim - len(tuple(index)))


def _add(pairs):
    first = sum(int(a) for a, _ in pairs) & MASK
    second = sum(int(b) for _, b in pairs) & MASK
    return first, second


def _across_processes(totals):
    """Each process summed the shards it holds: add the partial sums of all processes."""
    if jax.process_count() == 1:
        return totals
    from jax.experimental import multihost_utils

    gathered = np.asarray(multihost_utils.process_allgather(totals.astype(np.uint32)), dtype=np.uint64)  # (P, N, 2)
    return gathered.sum(axis=0) & MASK


def _all_processes(finite):
    if jax.process_count() == 1 or finite.size == 0:
        return finite
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(finite)).all(axis=0)


def _words(data):
    """``uint32``: the bits of ``data``, in its own shape (64-bit types: a trailing axis of 2)."""
    if data.dtype == jnp.bool_:
        data = data.astype(jnp.uint8)
    size = data.dtype.itemsize
    if size in (1, 2):
        return jax.lax.bitcast_convert_type(data, jnp.uint8 if size == 1 else jnp.uint16).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(data, jnp.uint32)


@jax.jit
def _shard_sums(data, start, strides):
    """The two sums over one shard. ``start`` and ``strides`` (``uint32[ndim]``): the shard's
    offset in the whole array and the whole array's strides, as arguments, so that shards
    of one shape and dtype share one compiled program whatever array they belong to."""
    words = _words(data)  # uint32[local shape]
    index = jnp.zeros(words.shape, jnp.uint32)  # row-major position in the whole array, mod 2**32
    for axis in range(words.ndim):
        position = jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) + start[axis]
        index = index + position * strides[axis]
    first = jnp.sum(words * (2 * index + 1), dtype=jnp.uint32)
    second = jnp.sum((words ^ (index * jnp.uint32(0x9E3779B9))) * jnp.uint32(0x01000193), dtype=jnp.uint32)
    return first, second


@jax.jit
def _all_finite(data):
    return jnp.all(jnp.isfinite(data))
