"""Zoo models; each family ships its own ``get_layout_map``."""

from zoo.models.cnn import SmallCNN
from zoo.models.encoder import ENCODER_CONFIGS, TransformerEncoderClassifier
from zoo.models.gpt import GPT_CONFIGS, GPTBackbone, GPTCausalLM
from zoo.models.vit import VIT_CONFIGS, ViTClassifier

__all__ = [
    "ENCODER_CONFIGS",
    "GPT_CONFIGS",
    "GPTBackbone",
    "GPTCausalLM",
    "SmallCNN",
    "TransformerEncoderClassifier",
    "VIT_CONFIGS",
    "ViTClassifier",
]
