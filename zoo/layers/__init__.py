"""Keras layers; the only package that calls ``shard_map`` (``run_on_mesh`` is its cached
path for code that runs a kernel on a mesh of its own: the benchmarks).

Besides the layers: the attention paths the layers run (``plain_attention``,
``sharded_attention``, ``describe_attention``) and the factored LoRA call of a Keras
``Dense`` / ``EinsumDense`` (``factored_lora_call``, ``kernel_variable``), for the
benchmarks and ``zoo.training``'s LoRA; the weights-only quantization config the layers
take by default (``weight_only_config``, ``INT4_BLOCK``) and a quantized-built layer's
fill (``fill_quantized``, ``is_built_quantized``), for QLoRA and the checkpoint loaders.
"""

from zoo.layers._lora import (
    check_lora_rank,
    enable_layer_lora,
    factor_axes_like,
    factor_layout_keys,
    lora_target_layers,
)
from zoo.layers._parallel_plan import run_on_mesh
from zoo.layers._quantized import (
    INT4_BLOCK,
    QUANTIZATION_WEIGHTS,
    fill_quantized,
    float_parameter_count,
    is_built_quantized,
    weight_only_config,
)
from zoo.layers._sequence_parallel import describe_attention, plain_attention, sharded_attention
from zoo.layers._tensor_parallel import factored_lora_call, kernel_variable
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
    "INT4_BLOCK",
    "QUANTIZATION_WEIGHTS",
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
    "check_lora_rank",
    "describe_attention",
    "enable_layer_lora",
    "factor_axes_like",
    "factor_layout_keys",
    "factored_lora_call",
    "fill_quantized",
    "float_parameter_count",
    "is_built_quantized",
    "kernel_variable",
    "lora_target_layers",
    "plain_attention",
    "rotary_angles",
    "run_on_mesh",
    "sharded_attention",
    "weight_only_config",
]
