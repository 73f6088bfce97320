"""Keras layers; the only package that calls ``shard_map``."""

from zoo.layers.column_parallel_dense import ColumnParallelDense
from zoo.layers.moe_feed_forward import MoEFeedForward
from zoo.layers.multi_head_attention import MultiHeadAttention
from zoo.layers.offset_rms_normalization import OffsetRMSNormalization
from zoo.layers.parallel_mlp import ParallelMLP
from zoo.layers.rotary_embedding import apply_rotary_embedding, rotary_angles
from zoo.layers.row_parallel_dense import RowParallelDense
from zoo.layers.transformer_block import TransformerBlock
from zoo.layers.pipelined_blocks import PipelinedBlocks

__all__ = [
    "ColumnParallelDense",
    "MoEFeedForward",
    "MultiHeadAttention",
    "OffsetRMSNormalization",
    "ParallelMLP",
    "PipelinedBlocks",
    "RowParallelDense",
    "TransformerBlock",
    "apply_rotary_embedding",
    "rotary_angles",
]
