"""Keras layers; the only package that calls ``shard_map``."""

from zoo.layers.multi_head_attention import MultiHeadAttention
from zoo.layers.rotary_embedding import apply_rotary_embedding, rotary_angles

__all__ = ["MultiHeadAttention", "apply_rotary_embedding", "rotary_angles"]
