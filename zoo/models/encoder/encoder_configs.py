"""Named ``TransformerEncoderClassifier`` configs (``from_config_name(name, **overrides)``).

C = hidden_dim, F = intermediate_dim; head_dim = C / num_query_heads. Parameter counts are
for the config as written (biases on, learned positions, mean pooling).
"""

ENCODER_CONFIGS = {
    # 27.5k parameters: CPU tests and doc examples (byte tokens, 4 topics).
    "encoder_tiny": dict(
        vocabulary_size=256,  # byte tokens (zoo.data.ByteTokenizer), id 0 = padding
        num_classes=4,  # python_docs_topics
        max_sequence_length=64,  # positions in the learned table
        num_layers=2,  # TransformerBlocks
        num_query_heads=4,  # divisible by a model axis of 1, 2 or 4
        hidden_dim=32,  # C
        intermediate_dim=64,  # F
    ),
    # 4.9M parameters: trains on python_docs_topics on one CPU in minutes.
    "encoder_small": dict(
        vocabulary_size=256,
        num_classes=4,
        max_sequence_length=512,
        num_layers=6,
        num_query_heads=8,
        hidden_dim=256,
        intermediate_dim=1024,
    ),
    # 110M parameters: BERT-base's shape (12 x 768, 12 heads, F 3072, 512 positions)
    # with a 32000-token vocabulary, which divides by model axes up to 256.
    "encoder_base": dict(
        vocabulary_size=32000,
        num_classes=2,
        max_sequence_length=512,
        num_layers=12,
        num_query_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
    ),
}
