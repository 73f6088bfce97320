"""Where attention runs: the plain single-program path, or a ``shard_map`` kernel.

The layer hands its projected q, k, v here with its ``ParallelPlan``
(``zoo.layers._parallel_plan``: resolved once per call from the global Keras
distribution), which names the kernel, the axes and the balance. This module decides the
path, checks sizes on the *global* shapes before any tracing of a kernel, and runs
``zoo.kernels`` under ``jax.shard_map``.

Paths:

- plain: ``kernels.local_attention`` on whole arrays: the kernel the attention seam
  selects (``zoo.kernels.attention_seam``: splash on a TPU, cuDNN on a GPU where they
  apply, else the tiled online-softmax kernel, memory O(T x tile)). GSPMD partitions it if the
  arrays are sharded (batch or heads). Taken when the plan has no ``context_attention``:
  the layer names no kernel and no ``ContextParallel`` is active, no distribution is
  set, or the mesh has no sequence axis of size > 1 (one device, ``DataParallel``,
  tensor parallelism alone: a kernel named by the layer, or recorded in its saved
  config, then runs plain attention with the same numbers). Also callable inside a
  ``shard_map`` body on local arrays.
- sharded: ``shard_map`` over the whole mesh with q, k, v in
  ``P(batch_axis, sequence_axis, None, None)`` and the key mask in
  ``P(batch_axis, sequence_axis)``; ``batch_axis`` is None when the mesh does not
  split the batch. Other mesh axes (e.g. ``model``) see replicated inputs.

Under a ``zoo.distribution.ContextParallel`` distribution the plan takes its sequence
axis, batch axis and balance, and its ``context_attention`` for a layer whose own is
None (an explicit kernel wins); a layer that names a different sequence axis, batch axis
or balance is an error: the distribution decides how the inputs are split and ordered.

Positions: with ``balance`` the inputs are already in the load-balanced order of the
sequence axis' size N (``zoo.kernels.reorder``). Each token's global position is then
``permutation(T, N, balance)[j]`` on the plain path and ``shard_positions(...)`` inside
a shard; both give the same number for the same token. With N = 1 every order is the
natural one. Rotary embedding and causality both use these positions.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from zoo import kernels
from zoo.distribution.axes import SEQ
from zoo.distribution.mesh import mesh_axis_size
from zoo.layers._parallel_plan import ParallelPlan, resolve_plan, run_sharded

_KERNELS = {
    "gather": kernels.gather_kv_attention,
    "ring": kernels.ring_attention,
    "ulysses": kernels.ulysses_attention,
}


def attention(
    q,
    k,
    v,
    *,
    plan,
    spec,
    key_mask=None,
    rope=None,
    segment_ids=None,
):
    """Self-attention of q [B, T, H, D] over k, v [B, T, K, D]; returns [B, T, H, D].

    plan: the layer's ``ParallelPlan``. spec: the layer's ``kernels.AttentionSpec`` (causal,
    scale, sliding window, soft-cap, tile edge), the same on every path: plain, ring, and
    the local step of gather and Ulysses. key_mask: bool[B, T] or None (True keeps the
    key). rope: None for no rotary embedding, else the layer's ``Rope`` (applied to q and
    k at their global positions). segment_ids: i32[B, T] or None, document ids of packed
    rows (0 = padding): a token attends only within its document, on every path (split
    over the sequence like x).
    """
    if plan.context_attention is None:
        return plain_attention(
            q,
            k,
            v,
            spec=spec,
            key_mask=key_mask,
            balance=plan.balance,
            rope=rope,
            axis_size=plan.sequence_size,
            axis_name=plan.sequence_axis,
            segment_ids=segment_ids,
            pallas=plan.mesh is None or plan.mesh.size == 1,  # GSPMD cannot split a Pallas call
        )
    return _sharded(q, k, v, plan=plan, spec=spec, key_mask=key_mask, rope=rope, segment_ids=segment_ids)


def describe_plan(plan):
    """The kernel and collectives ``attention`` runs under ``plan``, in words, e.g.
    ``"ring attention over seq (4), K/V ppermute x3 per call"``."""
    n, axis = plan.sequence_size, plan.sequence_axis
    if plan.context_attention is None:
        return "plain attention, no collective" + (f" (sequence split over {axis} ({n}) by GSPMD)" if axis else "")
    collectives = {
        "ring": f"K/V ppermute x{n - 1} per call",
        "gather": "K/V all-gather per call",
        "ulysses": "4 all-to-alls (q, k, v in, output back) per call",
    }[plan.context_attention]
    balance = "" if plan.balance is None else f", {plan.balance} order"
    return f"{plan.context_attention} attention over {axis} ({n}), {collectives}{balance}"


def describe_attention(
    *,
    seq_len,
    head_dim,
    dtype="float32",
    causal=False,
    masked=False,
    context_attention=None,
    balance=None,
    sequence_axis=SEQ,
    batch_axis=None,
    block_size=512,
    platform=None,
):
    """What ``attention`` runs for these settings under the current distribution, in words.

    E.g. ``"blockwise (tile 512)"``, ``"cudnn"``, ``"ring over 'seq' (N=4, tile 128)"``,
    ``"all-gather over 'seq' (N=4), then blockwise (tile 256x512)"``, ``"Ulysses over
    'seq' (N=4), then cudnn"``. Arguments are the layer's (``block_size`` is its
    ``ring_block_size``) plus one call's global sequence length, head dim and q's dtype
    (the layer's compute dtype); ``masked``: a key mask is passed; ``platform``
    defaults to ``jax.default_backend()``. Raises as ``attention``
    would on settings it refuses (not on sizes).
    """
    plan = resolve_plan(
        sequence_axis=sequence_axis, batch_axis=batch_axis, context_attention=context_attention, balance=balance
    )
    return describe_local(
        plan,
        seq_len=seq_len,
        head_dim=head_dim,
        dtype=dtype,
        causal=causal,
        masked=masked,
        block_size=block_size,
        platform=platform,
    )


def describe_local(
    plan, *, seq_len, head_dim, dtype, causal, masked, block_size, platform=None, pallas=None, windowed=False
):
    """``describe_attention`` for a resolved plan; ``pallas`` as ``plain_attention``'s
    (None: as ``attention`` passes it, a Pallas kernel only on a one-device mesh);
    ``windowed``: the layer has a sliding window."""
    pallas = (plan.mesh is None or plan.mesh.size == 1) if pallas is None else pallas
    n, balance, kernel = plan.sequence_size, plan.balance, plan.context_attention
    local = functools.partial(
        kernels.describe_local_attention,
        platform=jax.default_backend() if platform is None else platform,
        dtype=dtype,
        head_dim=head_dim,
        causal=causal,
        masked=masked,
        block_size=block_size,
        windowed=windowed,
    )
    if kernel is None:  # plain; on a split axis GSPMD may split T: tiles (see plain_attention)
        return local(q_len=seq_len, kv_len=seq_len, natural_order=n == 1, sequence_split=n > 1, pallas=pallas)
    over = f"over {plan.sequence_axis!r} (N={n}"
    if kernel == "ring":
        return f"ring {over}, tile {kernels.block_size_for(seq_len // n, block_size, balance)})"
    inside = functools.partial(local, pallas=False)  # a shard_map's body: no Pallas kernel (KernelQuery)
    if kernel == "gather":  # local queries are one shard: not in natural order when N > 1
        return f"all-gather {over}), then {inside(q_len=seq_len // n, kv_len=seq_len, natural_order=False)}"
    return f"Ulysses {over}), then {inside(q_len=seq_len, kv_len=seq_len, natural_order=balance is None)}"


def global_positions(seq_len, *, axis_size, axis_name, balance):
    """i32[T] global position of each token in array order (None: natural order)."""
    if balance is None or axis_size == 1:
        return None
    kernels.check_sequence_divisible(seq_len, axis_size=axis_size, axis_name=axis_name, balance=balance)
    return jnp.asarray(kernels.permutation(seq_len, num_shards=axis_size, balance=balance))


def plain_attention(
    q,
    k,
    v,
    *,
    spec,
    key_mask,
    balance,
    rope,
    axis_size,
    axis_name,
    segment_ids=None,
    pallas=True,
):
    """The single-program path on whole arrays (GSPMD partitions it if they are sharded).

    Works on local arrays inside a ``shard_map`` body too (e.g. one device's heads).
    ``spec``: the layer's ``kernels.AttentionSpec``. ``segment_ids`` i32[B, T] or None: the queries' and keys' document ids (packing).
    ``pallas``: whether a Pallas kernel may run (splash on a TPU): not where GSPMD would
    partition this call over several devices.
    """
    positions = global_positions(q.shape[1], axis_size=axis_size, axis_name=axis_name, balance=balance)
    if rope is not None:
        rotary_positions = jnp.arange(q.shape[1], dtype=jnp.int32) if positions is None else positions
        q, k = (rope.apply(x, rotary_positions) for x in (q, k))
    return kernels.local_attention(
        q,
        k,
        v,
        key_mask=key_mask,
        q_positions=positions,
        k_positions=positions,
        segment_ids=segment_ids,
        pallas=pallas,
        sequence_split=axis_size > 1,  # GSPMD may shard T on a split sequence axis: the tiled kernel
        **spec.options(),
    )


def sharded_attention(
    q,
    k,
    v,
    *,
    mesh,
    spec,
    key_mask,
    context_attention,
    balance,
    rope,
    sequence_axis,
    batch_axis,
    segment_ids=None,
):
    """Runs the ``context_attention`` kernel under ``jax.shard_map`` on ``mesh`` (a Keras
    DeviceMesh) with no distribution needed (benchmarks); layers go through ``attention``."""
    axis_size = lambda axis: mesh_axis_size(mesh, axis) if axis in mesh.axis_names else 1  # noqa: E731
    plan = ParallelPlan(
        keras_mesh=mesh,
        mesh=mesh.backend_mesh,
        sequence_axis=sequence_axis,
        sequence_size=axis_size(sequence_axis),
        batch_axis=batch_axis if axis_size(batch_axis) > 1 else None,
        batch_size=axis_size(batch_axis),
        context_attention=context_attention,
        balance=balance,
    )
    return _sharded(q, k, v, plan=plan, spec=spec, key_mask=key_mask, rope=rope, segment_ids=segment_ids)


def _sharded(q, k, v, *, plan, spec, key_mask, rope, segment_ids=None):
    """Runs the plan's kernel under ``jax.shard_map`` on its mesh (one cached program per setting)."""
    batch, seq_len, num_heads, _ = q.shape
    kernels.check_sequence_parallel(
        plan.context_attention,
        seq_len=seq_len,
        num_heads=num_heads,
        num_kv_heads=k.shape[2],
        axis_size=plan.sequence_size,
        axis_name=plan.sequence_axis,
        balance=plan.balance,
    )
    if plan.batch_axis is not None and batch % plan.batch_size:
        raise ValueError(
            f"batch size {batch} is not divisible by the {plan.batch_axis!r} mesh axis of size "
            f"{plan.batch_size} (sequence-parallel attention splits the batch over it)"
        )
    split = P(plan.batch_axis, plan.sequence_axis, None, None)  # q, k, v, out: [B, T, heads, D]
    mask_split = None if key_mask is None else P(plan.batch_axis, plan.sequence_axis)  # bool[B, T]
    ids_split = None if segment_ids is None else P(plan.batch_axis, plan.sequence_axis)  # i32[B, T]
    return run_sharded(
        plan,
        _shard_body,
        (q, k, v, key_mask, segment_ids),
        (split, split, split, mask_split, ids_split),
        split,
        context_attention=plan.context_attention,
        axis_name=plan.sequence_axis,
        spec=spec,
        balance=plan.balance,
        rope=rope,
    )


def _shard_body(
    q,
    k,
    v,
    key_mask,
    segment_ids,
    *,
    context_attention,
    axis_name,
    spec,
    balance,
    rope,
):
    """One device's share. Nb = batch-axis size (1 if none), N = sequence-axis size.

    q: [B/Nb, T/N, H, D], k/v: [B/Nb, T/N, K, D], key_mask: bool[B/Nb, T/N] or None,
    segment_ids: i32[B/Nb, T/N] or None; returns [B/Nb, T/N, H, D].
    """
    if rope is not None:
        # i32[T/N]: global positions of this shard's tokens (balanced order aware)
        positions = kernels.shard_positions(
            q.shape[1],
            shard_index=jax.lax.axis_index(axis_name),
            num_shards=jax.lax.axis_size(axis_name),
            balance=balance,
        )
        q, k = (rope.apply(x, positions) for x in (q, k))
    return _KERNELS[context_attention](
        q,
        k,
        v,
        axis_name=axis_name,
        key_mask=key_mask,
        balance=balance,
        segment_ids=segment_ids,
        **spec.options(),
    )
