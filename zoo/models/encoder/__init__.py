from zoo.models.encoder.encoder_configs import ENCODER_CONFIGS
from zoo.models.encoder.transformer_encoder_classifier import TransformerEncoderClassifier

__all__ = ["ENCODER_CONFIGS", "TransformerEncoderClassifier"]
