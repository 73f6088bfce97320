"""The experts' grouped matmul: SwiGLU expert MLPs over rows sorted by expert.

``expert_mlp(rows, group_sizes, ...)`` runs each expert's MLP on its contiguous run of
rows, by one of ``GROUPED_MATMULS``:

- ``"ragged_dot"``: ``jax.lax.ragged_dot``, XLA's grouped matmul; the default on GPU, and
  on TPU inside the expert layouts' ``shard_map``;
- ``"megablox"``: JAX's Pallas grouped matmul (``jax.experimental.pallas.ops.tpu.megablox``,
  the TPU kernel MaxText runs), its rows padded to 128, its tiles chosen per shape
  (``megablox_tiling``, whose largest tiles were the fastest of six on a TPU v5e); the
  default on a TPU outside a ``shard_map``, and only there (``_megablox_matmul`` says why);
- ``"blocks"``: a loop over blocks of rows, each block one expert's; the default on
  XLA:CPU, whose ``ragged_dot`` computes every group for every row (measured 8.4 ms vs
  10.0 ms dense, 0.9 ms one expert, at 512 rows, 8 experts, 256 x 512): the work is the
  rows plus at most one partial block per expert.

``compile_for(platform)`` traces for another platform than the one compiling (a plan on
CPU of a GPU's step gets ``ragged_dot``). ``zoo.kernels.moe`` routes, sorts and exchanges
the rows; this module only multiplies them.
"""

import contextlib
import math

import jax
import jax.numpy as jnp

from zoo.config.choices import GROUPED_MATMULS
from zoo.kernels.collective_matmul import _varying_axes

__all__ = [
    "GROUPED_MATMULS",
    "MEGABLOX_TILING",
    "compile_for",
    "expert_mlp",
    "grouped_matmul_implementation",
    "megablox_tiling",
]

MAX_BLOCK_ROWS = 128  # rows per block of the "blocks" grouped matmul
MEGABLOX_ROW_TILE = 128  # megablox's rows are padded to a multiple of this
MEGABLOX_TILING = (512, 1024, 1024)  # megablox's largest (rows, depth, width) tiles; megablox_tiling halves them to fit


_COMPILING_FOR = []  # the platforms compile_for() says the programs being traced are for (innermost last)


def grouped_matmul_implementation(platform=None, *, in_shard_map=False):
    """The default grouped matmul: ``"blocks"`` on CPU (whose ragged_dot is dense);
    ``"megablox"`` on a TPU that runs the program, outside a ``shard_map`` (measured
    faster than ``ragged_dot`` on a TPU v5e: 17.45 vs 18.40 ms for the layer's forward +
    backward at E = 8, k = 2, 30.42 vs 33.76 at E = 64, k = 8; docs/performance.md);
    ``"ragged_dot"`` otherwise (GPU; inside the expert layouts' shard_map; a TPU's step
    compiled elsewhere). The platform: ``platform``, else the one ``compile_for`` names,
    else JAX's backend."""
    platform = platform or _target_platform()
    if platform == "cpu":
        return "blocks"
    runs_here = platform == "tpu" == jax.default_backend()  # a Mosaic kernel compiles only for the TPU that runs it
    return "megablox" if runs_here and not in_shard_map else "ragged_dot"


def _manual_axes(*arrays):
    """The shard_map mesh axes any of ``arrays`` varies over (empty outside a shard_map)."""
    return frozenset().union(*(_varying_axes(array) for array in arrays))


def _target_platform():
    """The platform the programs being traced are for: the one ``compile_for`` names, else JAX's backend."""
    return _COMPILING_FOR[-1] if _COMPILING_FOR else jax.default_backend()


@contextlib.contextmanager
def compile_for(platform):
    """Trace MoE layers for ``platform`` ("gpu", "tpu", "cpu") whatever runs the compile:
    a compile-only plan on CPU of a GPU step gets the GPU's grouped matmul
    (``ragged_dot``), not the CPU's loop over row blocks."""
    _COMPILING_FOR.append(platform)
    try:
        yield
    finally:
        _COMPILING_FOR.pop()


def expert_mlp(rows, group_sizes, *, expert_gate, expert_up, expert_down, implementation=None):
    """SwiGLU expert MLPs over rows sorted by expert: rows [R, C] whose first
    ``group_sizes[0]`` rows belong to expert 0, the next to expert 1, ...; group_sizes
    i32[G] (their sum at most R: the rows past it give zeros); expert_gate / expert_up
    [G, C, F], expert_down [G, F, C] -> [R, C]."""
    implementation = implementation or grouped_matmul_implementation(in_shard_map=bool(_manual_axes(rows, expert_gate)))
    if implementation not in GROUPED_MATMULS:
        raise ValueError(f"implementation must be one of {GROUPED_MATMULS}, got {implementation!r}")
    if implementation == "blocks":
        return _blocked_expert_mlp(rows, group_sizes, expert_gate, expert_up, expert_down)
    matmul = jax.lax.ragged_dot if implementation == "ragged_dot" else _megablox_matmul
    gate = matmul(rows, expert_gate, group_sizes)  # [R, F]
    up = matmul(rows, expert_up, group_sizes)  # [R, F]
    return matmul(jax.nn.silu(gate) * up, expert_down, group_sizes)  # [R, C]


def megablox_tiling(num_rows, depth, width, largest=None):
    """(tm, tk, tn) for ``gmm`` of [m, k] rows by [G, k, n] weights: each edge the largest
    of ``largest``'s (default ``MEGABLOX_TILING``) halvings, down to 128, that divides the
    dimension, else the whole dimension; ``num_rows`` is already a multiple of 128
    (``_megablox_matmul`` pads)."""
    largest = MEGABLOX_TILING if largest is None else largest

    def edge(size, most):
        candidates = [most >> shift for shift in range(8) if (most >> shift) >= 128]
        return next((tile for tile in candidates if size % tile == 0), size)

    return tuple(edge(size, most) for size, most in zip((num_rows, depth, width), largest))


def _megablox_matmul(rows, weights, group_sizes):
    """JAX's Pallas grouped matmul (megablox ``gmm``, with its own backward: ``gmm`` for the
    rows' gradient, ``tgmm`` for the weights', both at the forward's tiling: a tiling of
    their own, tried on a TPU v5e, gained nothing at the layer; docs/performance.md):
    rows [R, k] by weights [G, k, n] -> [R, n]. Every row must belong to a group
    (``sum(group_sizes) == R``, as ``sparse_moe``'s sorted assignments do): the kernel leaves
    rows past the groups unwritten, where ``ragged_dot`` gives zeros. R is padded to a
    multiple of 128 (the kernel's row tiles), the padding sliced off. Traced for any
    platform but a TPU, it runs in Pallas' interpreter (the tests' way on CPU: slow, exact).

    Not inside a ``shard_map`` (the MoE layer's, under any distribution): JAX refuses the kernel's
    ``pallas_call`` there, its output shape naming no varying mesh axes, and tracing it
    outside that check breaks under remat, which traces the kernel's bookkeeping again
    with the check on (tried; docs/attention.md, "Inside a shard_map")."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm  # Pallas' TPU kernels: imported where used

    axes = _manual_axes(rows, weights)
    if axes:
        raise ValueError(
            "grouped_matmul='megablox' runs outside a shard_map (an MoE layer with no distribution, a function GSPMD "
            "partitions), not inside one such as the MoE layer's under a distribution "
            f"(the rows vary over {sorted(axes)}); use 'ragged_dot' there"
        )
    num_rows, depth = rows.shape
    padded = -(-num_rows // MEGABLOX_ROW_TILE) * MEGABLOX_ROW_TILE
    lhs = jnp.pad(rows, ((0, padded - num_rows), (0, 0)))  # [R', k]
    tiling = megablox_tiling(padded, depth, weights.shape[-1])  # the forward's; gmm's VJP reuses it
    out = gmm(
        lhs, weights.astype(rows.dtype), group_sizes, rows.dtype, tiling, None, None, False, _target_platform() != "tpu"
    )
    return out[:num_rows]  # [R, n]


def block_rows(num_rows, num_groups):
    """Rows per block of the ``"blocks"`` matmul: the average group's rows as a power
    of two, between 8 and ``MAX_BLOCK_ROWS`` (padding costs at most a block per group)."""
    average = max(1, num_rows // max(1, num_groups))
    return int(min(MAX_BLOCK_ROWS, max(8, 2 ** math.ceil(math.log2(average)))))


def _blocked_expert_mlp(rows, group_sizes, expert_gate, expert_up, expert_down):
    """Each group's rows padded to whole blocks of b rows; a loop over the blocks runs
    each block's rows through its group's MLP (one [b, C] x [C, F] matmul pair and one
    [b, F] x [F, C] per block)."""
    num_rows, width = rows.shape
    num_groups = group_sizes.shape[0]
    block = block_rows(num_rows, num_groups)
    num_blocks = -(-num_rows // block) + num_groups  # enough for every group's partial block
    padded_sizes = -(-group_sizes // block) * block  # i32[G]
    group_ends = jnp.cumsum(group_sizes)  # i32[G]
    row = jnp.arange(num_rows, dtype=jnp.int32)
    group_of_row = jnp.searchsorted(group_ends, row, side="right").astype(jnp.int32)  # i32[R]; G past the last group
    valid = group_of_row < num_groups
    group = jnp.minimum(group_of_row, num_groups - 1)
    padded_start = jnp.cumsum(padded_sizes) - padded_sizes  # i32[G]
    position = padded_start[group] + row - (group_ends - group_sizes)[group]  # where each row goes, padded
    position = jnp.where(valid, position, num_blocks * block)  # the rows past every group: dropped
    padded = jnp.zeros((num_blocks * block, width), rows.dtype).at[position].set(rows, mode="drop")
    block_group = jnp.searchsorted(jnp.cumsum(padded_sizes) // block, jnp.arange(num_blocks), side="right")
    block_group = jnp.minimum(block_group, num_groups - 1).astype(jnp.int32)  # trailing empty blocks: any group

    @jax.checkpoint  # the backward keeps each block's rows, not its expert's sliced [C, F] weights (3 x C x F a block)
    def one_block(_, block_input):
        x, g = block_input  # [b, C], scalar
        hidden = jax.nn.silu(x @ expert_gate[g]) * (x @ expert_up[g])  # [b, F]
        return None, hidden @ expert_down[g]  # [b, C]

    _, outputs = jax.lax.scan(one_block, None, (padded.reshape(num_blocks, block, width), block_group))
    outputs = outputs.reshape(num_blocks * block, -1)  # [P, C]
    return jnp.where(valid[:, None], outputs.at[position].get(mode="fill", fill_value=0), 0)  # [R, C]
