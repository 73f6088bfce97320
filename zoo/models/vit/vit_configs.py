"""Named ``ViTClassifier`` configs (``from_config_name(name, **overrides)``).

C = hidden_dim, F = intermediate_dim; head_dim = C / num_query_heads. The small, base and
large configs are ViT-S/16, ViT-B/16 and ViT-L/16 (Dosovitskiy et al. 2021; DeiT-S) at
224 x 224; parameter counts are for the config as written (1000 classes, class token).
"""

VIT_CONFIGS = {
    # 19.6k parameters: CPU tests and doc examples (16 x 16 "shapes" images, 16 patches).
    "vit_tiny": dict(
        image_size=16,  # pixels per side
        patch_size=4,  # 4 x 4 patches: 16 tokens (+ the class token)
        num_classes=8,  # zoo.data "shapes"
        num_layers=2,  # TransformerBlocks
        num_query_heads=4,  # divisible by a model axis of 1, 2 or 4
        hidden_dim=32,  # C
        intermediate_dim=64,  # F
    ),
    # 22.1M parameters: ViT-S/16 (6 heads: tensor parallelism over 2, 3 or 6 devices).
    "vit_small": dict(
        image_size=224,
        patch_size=16,
        num_classes=1000,
        num_layers=12,
        num_query_heads=6,
        hidden_dim=384,
        intermediate_dim=1536,
    ),
    # 86.6M parameters: ViT-B/16.
    "vit_base": dict(
        image_size=224,
        patch_size=16,
        num_classes=1000,
        num_layers=12,
        num_query_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
    ),
    # 304M parameters: ViT-L/16.
    "vit_large": dict(
        image_size=224,
        patch_size=16,
        num_classes=1000,
        num_layers=24,
        num_query_heads=16,
        hidden_dim=1024,
        intermediate_dim=4096,
    ),
}
