"""Where attention runs: the plain single-program path, or a ``shard_map`` kernel.

The layer hands its projected q, k, v here. This module fetches the mesh from the
global Keras distribution (``keras.distribution.distribution()``: Keras does not enter
the distribution as a context during ``fit``, so the global one is what is in force),
decides the path, checks sizes on the *global* shapes before any tracing of a kernel,
and runs ``zoo.kernels`` under ``jax.shard_map``.

Paths:

- plain: ``kernels.local_attention`` on whole arrays: the tiled online-softmax kernel
  (``blockwise_attention``, memory O(T x tile)), or cuDNN's fused attention on a GPU
  where it applies (``kernels.attention_implementation``). GSPMD partitions it if the
  arrays are sharded (batch or heads). Taken when ``strategy`` is None, when no
  distribution is set, or when the distribution's ``sequence_axis`` has size 1 (same
  numbers as one device). Also callable inside a ``shard_map`` body on local arrays.
- sharded: ``shard_map`` over the whole mesh with q, k, v in
  ``P(batch_axis, sequence_axis, None, None)`` and the key mask in
  ``P(batch_axis, sequence_axis)``; ``batch_axis`` is dropped (None) when the mesh has
  no such axis. Other mesh axes (e.g. ``model``) see replicated inputs.

A distribution whose mesh lacks ``sequence_axis`` while a strategy is set is an
error naming the mesh's axes (not a silent fallback to the plain path).

Under a ``zoo.distribution.ContextParallel`` distribution the layer's settings are
completed from it (``context_settings``): a layer with ``strategy`` None runs the
distribution's ``attention`` kernel (an explicit strategy wins), and the sequence
axis, batch axis and ``balance`` are the distribution's. A layer that names a
different sequence axis, batch axis or balance is an error: the distribution decides
how the inputs are split and ordered.

Positions: with ``balance`` the inputs are already in the load-balanced order of the
sequence axis' size N (``zoo.kernels.reorder``). Each token's global position is then
``permutation(T, N, balance)[j]`` on the plain path and ``shard_positions(...)`` inside
a shard; both give the same number for the same token. With N = 1 every order is the
natural one. Rotary embedding and causality both use these positions.
"""

import functools

import jax
import jax.numpy as jnp
import keras
from jax.sharding import PartitionSpec as P

from zoo import kernels
from zoo.distribution.axes import DATA, SEQ
from zoo.distribution.context_parallel import ContextParallel
from zoo.distribution.mesh import MeshError, describe_mesh, mesh_axis_size
from zoo.layers.rotary_embedding import apply_rotary_embedding

STRATEGIES = (None, "gather", "ring", "ulysses")
BALANCES = (None, "zigzag", "striped")

_KERNELS = {
    "gather": kernels.gather_kv_attention,
    "ring": kernels.ring_attention,
    "ulysses": kernels.ulysses_attention,
}


def check_strategy(strategy, balance=None):
    """Raises unless ``strategy`` is in ``STRATEGIES`` and ``balance`` in ``BALANCES``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"sequence_parallel must be one of {STRATEGIES}, got {strategy!r}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")


def context_settings(strategy, balance, sequence_axis, batch_axis):
    """``(strategy, balance, sequence_axis, batch_axis)`` in force for a layer's settings.

    Unchanged unless the global distribution is a ``ContextParallel``; then its
    ``attention`` fills a None strategy and its axes and balance are used. The layer's
    defaults (``"seq"``, ``"data"``, None) defer to the distribution; other values
    that differ from it raise ``ValueError`` naming both.
    """
    distribution = keras.distribution.distribution()
    if not isinstance(distribution, ContextParallel):
        return strategy, balance, sequence_axis, batch_axis
    _check_agrees("sequence_axis", sequence_axis, SEQ, "sequence_dim_name", distribution.sequence_dim_name)
    _check_agrees("batch_axis", batch_axis, DATA, "batch_dim_name", distribution.batch_dim_name)
    _check_agrees("balance", balance, None, "balance", distribution.balance)
    strategy = distribution.attention if strategy is None else strategy
    return strategy, distribution.balance, distribution.sequence_dim_name, distribution.batch_dim_name


def _check_agrees(name, value, default, distribution_name, distribution_value):
    if value != default and value != distribution_value:
        raise ValueError(
            f"attention layer {name}={value!r} conflicts with the ContextParallel distribution's "
            f"{distribution_name}={distribution_value!r}, which decides how inputs are split and ordered; "
            f"leave {name} at its default {default!r} to follow the distribution"
        )


def sequence_mesh(strategy, sequence_axis):
    """The distribution's ``DeviceMesh`` if it has ``sequence_axis``, else None.

    Raises ``MeshError`` if a strategy is set and the distribution's mesh lacks the axis.
    """
    distribution = keras.distribution.distribution()
    if distribution is None:
        return None
    mesh = distribution.device_mesh
    if sequence_axis in mesh.axis_names:
        return mesh
    if strategy is None:
        return None
    raise MeshError(
        f"sequence_parallel={strategy!r} splits the sequence over mesh axis "
        f"{sequence_axis!r}, but the distribution's mesh {describe_mesh(mesh)} has axes "
        f"{list(mesh.axis_names)}; add a {sequence_axis!r} axis to the mesh (size 1 is "
        f"allowed), set sequence_axis to one of its axes, or use sequence_parallel=None"
    )


def attention(
    q,
    k,
    v,
    *,
    key_mask=None,
    strategy=None,
    causal=False,
    balance=None,
    rotary_base=None,
    sequence_axis="seq",
    batch_axis="data",
    ring_block_size=512,
):
    """Self-attention of q [B, T, H, D] over k, v [B, T, K, D]; returns [B, T, H, D].

    key_mask: bool[B, T] or None (True keeps the key). rotary_base: None for no rotary
    embedding, else RoPE's base (applied to q and k at their global positions).
    ring_block_size: tile edge of every tiled kernel (plain path, ring, and the local
    step of gather and Ulysses). ``describe_attention`` says in words what runs.
    """
    strategy, balance, sequence_axis, batch_axis, mesh, axis_size = resolve(strategy, balance, sequence_axis, batch_axis)
    if strategy is None or axis_size == 1:
        return plain_attention(
            q, k, v, key_mask=key_mask, causal=causal, balance=balance, rotary_base=rotary_base,
            axis_size=axis_size, axis_name=sequence_axis, block_size=ring_block_size,
        )
    return sharded_attention(
        q, k, v, mesh=mesh, key_mask=key_mask, strategy=strategy, causal=causal,
        balance=balance, rotary_base=rotary_base, sequence_axis=sequence_axis,
        batch_axis=batch_axis, ring_block_size=ring_block_size,
    )


def resolve(strategy, balance, sequence_axis, batch_axis):
    """``(strategy, balance, sequence_axis, batch_axis, mesh, N)`` in force for a layer's settings.

    Checks the settings, completes them from a ``ContextParallel`` distribution, and
    finds the mesh (None without a distribution) and the size N of its sequence axis.
    """
    check_strategy(strategy, balance)
    strategy, balance, sequence_axis, batch_axis = context_settings(strategy, balance, sequence_axis, batch_axis)
    mesh = sequence_mesh(strategy, sequence_axis)
    axis_size = 1 if mesh is None else mesh_axis_size(mesh, sequence_axis)
    return strategy, balance, sequence_axis, batch_axis, mesh, axis_size


def describe_attention(
    *,
    seq_len,
    head_dim,
    dtype="float32",
    causal=False,
    masked=False,
    strategy=None,
    balance=None,
    sequence_axis="seq",
    batch_axis="data",
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
    strategy, balance, sequence_axis, _, _, n = resolve(strategy, balance, sequence_axis, batch_axis)
    local = functools.partial(
        kernels.describe_local_attention, platform=jax.default_backend() if platform is None else platform,
        dtype=dtype, head_dim=head_dim, causal=causal, masked=masked, block_size=block_size,
    )
    if strategy is None or n == 1:  # plain; on a split axis GSPMD may split T: tiles (see plain_attention)
        return local(q_len=seq_len, kv_len=seq_len, natural_order=n == 1, cudnn=n == 1)
    over = f"over {sequence_axis!r} (N={n}"
    if strategy == "ring":
        return f"ring {over}, tile {kernels.block_size_for(seq_len // n, block_size, balance)})"
    if strategy == "gather":  # local queries are one shard: not in natural order when N > 1
        return f"all-gather {over}), then {local(q_len=seq_len // n, kv_len=seq_len, natural_order=False)}"
    return f"Ulysses {over}), then {local(q_len=seq_len, kv_len=seq_len, natural_order=balance is None)}"


def global_positions(seq_len, *, axis_size, axis_name, balance):
    """i32[T] global position of each token in array order (None: natural order)."""
    if balance is None or axis_size == 1:
        return None
    kernels.check_sequence_divisible(seq_len, axis_size=axis_size, axis_name=axis_name, balance=balance)
    return jnp.asarray(kernels.permutation(seq_len, num_shards=axis_size, balance=balance))


def plain_attention(
    q, k, v, *, key_mask, causal, balance, rotary_base, axis_size, axis_name, block_size=512
):
    """The single-program path on whole arrays (GSPMD partitions it if they are sharded).

    Works on local arrays inside a ``shard_map`` body too (e.g. one device's heads).
    ``block_size`` is the tile edge of the blockwise kernel (the layer's ``ring_block_size``).
    """
    positions = global_positions(q.shape[1], axis_size=axis_size, axis_name=axis_name, balance=balance)
    if rotary_base is not None:
        rotary_positions = jnp.arange(q.shape[1], dtype=jnp.int32) if positions is None else positions
        q, k = (apply_rotary_embedding(x, rotary_positions, base=rotary_base) for x in (q, k))
    # On a split sequence axis GSPMD may shard T, which cuDNN's partitioner refuses: tiles.
    kernel = kernels.local_attention if axis_size == 1 else kernels.blockwise_attention
    return kernel(
        q, k, v, causal=causal, key_mask=key_mask, q_positions=positions, k_positions=positions,
        block_size=block_size,
    )


def sharded_attention(
    q, k, v, *, mesh, key_mask, strategy, causal, balance, rotary_base, sequence_axis, batch_axis, ring_block_size
):
    """Runs the ``strategy`` kernel under ``jax.shard_map`` on ``mesh`` (a Keras DeviceMesh)."""
    batch, seq_len, num_heads, _ = q.shape
    axis_size = mesh_axis_size(mesh, sequence_axis)
    kernels.check_sequence_parallel(
        strategy, seq_len=seq_len, num_heads=num_heads, num_kv_heads=k.shape[2],
        axis_size=axis_size, axis_name=sequence_axis, balance=balance,
    )
    batch_axis = batch_axis if batch_axis in mesh.axis_names else None
    if batch_axis is not None and batch % mesh_axis_size(mesh, batch_axis):
        raise ValueError(
            f"batch size {batch} is not divisible by the {batch_axis!r} mesh axis of size "
            f"{mesh_axis_size(mesh, batch_axis)} (sequence-parallel attention splits the batch over it)"
        )
    run = _sharded_program(
        mesh.backend_mesh, batch_axis, key_mask is not None, strategy=strategy, axis_name=sequence_axis,
        causal=causal, balance=balance, rotary_base=rotary_base, ring_block_size=ring_block_size,
    )
    return run(q, k, v, key_mask)


@functools.lru_cache(maxsize=64)
def _sharded_program(jax_mesh, batch_axis, masked, **settings):
    """``jax.jit(shard_map(...))``, one per setting: eager calls reuse its compilation
    (a fresh ``shard_map`` per call would recompile every time); inside an outer
    ``jit`` it is simply inlined."""
    axis_name = settings["axis_name"]
    spec = P(batch_axis, axis_name, None, None)  # q, k, v, out: [B, T, heads, D]
    mask_spec = P(batch_axis, axis_name) if masked else None  # bool[B, T]
    body = functools.partial(_shard_body, **settings)
    return jax.jit(jax.shard_map(body, mesh=jax_mesh, in_specs=(spec, spec, spec, mask_spec), out_specs=spec))


def _shard_body(q, k, v, key_mask, *, strategy, axis_name, causal, balance, rotary_base, ring_block_size):
    """One device's share. Nb = batch-axis size (1 if none), N = sequence-axis size.

    q: [B/Nb, T/N, H, D], k/v: [B/Nb, T/N, K, D], key_mask: bool[B/Nb, T/N] or None;
    returns [B/Nb, T/N, H, D].
    """
    if rotary_base is not None:
        # i32[T/N]: global positions of this shard's tokens (balanced order aware)
        positions = kernels.shard_positions(
            q.shape[1], shard_index=jax.lax.axis_index(axis_name),
            num_shards=jax.lax.axis_size(axis_name), balance=balance,
        )
        q, k = (apply_rotary_embedding(x, positions, base=rotary_base) for x in (q, k))
    return _KERNELS[strategy](
        q, k, v, axis_name=axis_name, causal=causal, key_mask=key_mask, balance=balance,
        block_size=ring_block_size,
    )
