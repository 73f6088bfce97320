"""Pure JAX kernels that run on one shard inside ``jax.shard_map`` (no Keras here).

Shapes use B batch, T global sequence length, N size of the mesh axis the sequence is
split over, H query heads, K KV heads, D head dim, W attention window (``sliding_window``).
Sharded kernels see [B, T/N, H, D].
"""

from zoo.kernels._blocking import block_size_for, tile_plan
from zoo.kernels._checks import (
    check_heads_divisible,
    check_kv_heads,
    check_segment_ids,
    check_sequence_divisible,
    check_sequence_parallel,
    check_sliding_window,
    check_softcap,
)
from zoo.kernels.attention_reference import attention_reference
from zoo.kernels.attention_seam import (
    AttentionSpec,
    attention_implementation,
    describe_local_attention,
    local_attention,
    select_local_kernel,
)
from zoo.kernels.blockwise_attention import blockwise_attention, blockwise_tiles
from zoo.kernels.gather_attention import gather_kv_attention
from zoo.kernels.load_balance import (
    causal_block_work,
    permutation,
    reorder,
    restore,
    ring_steps,
    shard_positions,
)
from zoo.kernels.ring_attention import ring_attention, ring_attention_tiles
from zoo.kernels.ulysses_attention import ulysses_attention

__all__ = [
    "AttentionSpec",
    "attention_implementation",
    "attention_reference",
    "block_size_for",
    "blockwise_attention",
    "blockwise_tiles",
    "causal_block_work",
    "check_heads_divisible",
    "check_kv_heads",
    "check_segment_ids",
    "check_sequence_divisible",
    "check_sequence_parallel",
    "check_sliding_window",
    "check_softcap",
    "describe_local_attention",
    "gather_kv_attention",
    "local_attention",
    "permutation",
    "reorder",
    "restore",
    "ring_attention",
    "ring_attention_tiles",
    "ring_steps",
    "select_local_kernel",
    "shard_positions",
    "tile_plan",
    "ulysses_attention",
]

# Tensor parallelism (Megatron column/row-parallel dense layers, the sequence-parallel
# pair and collective matmuls). Shapes there: C model width, F hidden features, N the
# size of the mesh axis the features (or the sequence) are split over.
from zoo.kernels.collective_matmul import all_gather_matmul, matmul_reduce_scatter  # noqa: E402
from zoo.kernels.tensor_parallel import (  # noqa: E402
    check_divisible,
    column_parallel_matmul,
    dense_reference,
    mlp_activation,
    mlp_down_projection,
    mlp_reference,
    mlp_up_projections,
    row_parallel_matmul,
    sequence_parallel_column_matmul,
    sequence_parallel_row_matmul,
    tensor_parallel_mlp,
)

__all__ += [
    "all_gather_matmul",
    "check_divisible",
    "column_parallel_matmul",
    "dense_reference",
    "matmul_reduce_scatter",
    "mlp_activation",
    "mlp_down_projection",
    "mlp_reference",
    "mlp_up_projections",
    "row_parallel_matmul",
    "sequence_parallel_column_matmul",
    "sequence_parallel_row_matmul",
    "tensor_parallel_mlp",
]

# Mixture of Experts (routing, grouped expert MLPs, the expert-parallel exchange). Shapes
# there: N tokens on the shard, C width, E experts, k per token, F expert width.
from zoo.kernels.moe import (  # noqa: E402
    capacity,
    dense_moe,
    expert_mlp,
    expert_parallel_moe,
    load_balance_loss,
    minimum_exchange_bytes,
    moe_reference,
    route,
    router_z_loss,
    sparse_moe,
)

__all__ += [
    "capacity",
    "dense_moe",
    "expert_mlp",
    "expert_parallel_moe",
    "load_balance_loss",
    "minimum_exchange_bytes",
    "moe_reference",
    "route",
    "router_z_loss",
    "sparse_moe",
]
