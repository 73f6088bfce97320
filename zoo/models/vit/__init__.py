from zoo.models.vit.vit_classifier import ViTClassifier
from zoo.models.vit.vit_configs import VIT_CONFIGS

__all__ = ["VIT_CONFIGS", "ViTClassifier"]
