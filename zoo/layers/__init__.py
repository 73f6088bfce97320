"""Keras layers; the only package that calls ``shard_map``."""

from zoo.layers.class_token import ClassToken
from zoo.layers.column_parallel_dense import ColumnParallelDense
from zoo.layers.learned_position_embedding import LearnedPositionEmbedding
from zoo.layers.logit_softcap import LogitSoftcap
from zoo.layers.moe_feed_forward import MoEFeedForward
from zoo.layers.multi_head_attention import MultiHeadAttention
from zoo.layers.offset_rms_normalization import OffsetRMSNormalization
from zoo.layers.parallel_mlp import ParallelMLP
from zoo.layers.pipelined_blocks import PipelinedBlocks
from zoo.layers.rotary_embedding import apply_rotary_embedding, rotary_angles
from zoo.layers.row_parallel_dense import RowParallelDense
from zoo.layers.token_pooling import TokenPooling
from zoo.layers.transformer_block import TransformerBlock

__all__ = [
    "ClassToken",
    "ColumnParallelDense",
    "LearnedPositionEmbedding",
    "LogitSoftcap",
    "MoEFeedForward",
    "MultiHeadAttention",
    "OffsetRMSNormalization",
    "ParallelMLP",
    "PipelinedBlocks",
    "RowParallelDense",
    "TokenPooling",
    "TransformerBlock",
    "apply_rotary_embedding",
    "rotary_angles",
]
