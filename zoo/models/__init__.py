"""Zoo models; each family ships its own ``get_layout_map``; every class has ``from_preset``."""

from zoo.models._transformer_layouts import layout_overrides
from zoo.models.cnn import SmallCNN
from zoo.models.encoder import ENCODER_CONFIGS, TransformerEncoderClassifier
from zoo.models.encoder_classifier import EncoderClassifier
from zoo.models.gpt import GPT_CONFIGS, GPTBackbone, GPTCausalLM, GPTCausalLMPreprocessor
from zoo.models.vit import VIT_CONFIGS, ViTClassifier
from zoo.models.zoo_model import ZooModel

__all__ = [
    "ENCODER_CONFIGS",
    "GPT_CONFIGS",
    "VIT_CONFIGS",
    "EncoderClassifier",
    "GPTBackbone",
    "GPTCausalLM",
    "GPTCausalLMPreprocessor",
    "SmallCNN",
    "TransformerEncoderClassifier",
    "ViTClassifier",
    "ZooModel",
    "layout_overrides",
]
