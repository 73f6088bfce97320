"""The Vision Transformer classifier: images -> patches -> Transformer blocks -> logits."""

import keras

from zoo.distribution.axes import MODEL
from zoo.layers.class_token import ClassToken
from zoo.layers.learned_position_embedding import LearnedPositionEmbedding
from zoo.models import _classifier_layouts as layouts
from zoo.models._classifier_checks import check_common
from zoo.models.encoder_classifier import EncoderClassifier, classify, stack_arguments
from zoo.models.vit.vit_configs import VIT_CONFIGS


@keras.saving.register_keras_serializable(package="zoo")
class ViTClassifier(EncoderClassifier):
    """ViT (Dosovitskiy et al. 2021), pre-norm: patch embedding, N ``TransformerBlock``s, head.

    ```
    images (B, H, W, Ch) float
      -> patch_embedding: Conv2D, kernel = stride = patch (B, H/p, W/p, C)
      -> patch_sequence: reshape (B, P, C), P = (H/p)(W/p) patches
      -> [class_token: (B, 1 + P, C), when pooling="cls"]
      -> position_embedding: + learned (P (+1), C) table
      -> embedding_dropout -> block_0 .. block_{N-1} (no mask) -> final_norm
      -> pooling (class token, or mean over patches) (B, C)
      -> head_dropout -> classifier_head (B, num_classes)
    ```

    Args:
        image_size: ``(height, width)`` or one int; each side divisible by the patch.
        patch_size: ``(height, width)`` of a patch, or one int.
        num_classes: output logits.
        num_layers: N, Transformer blocks.
        num_query_heads: H, attention heads; must divide ``hidden_dim``.
        hidden_dim: C, the model width.
        intermediate_dim: F, the MLP's hidden features.
        channels: Ch, image channels (3 for RGB; the name SmallCNN uses).
        num_key_value_heads: K, key/value heads (GQA); None means H.
        mlp: ``"gelu"``, ``"relu"``, ``"geglu"`` or ``"swiglu"`` (``TransformerBlock``).
        norm: ``"layer"`` or ``"rms"``; also the final norm.
        layer_norm_epsilon: the norms' epsilon (1e-6 as in ViT).
        pooling: ``"cls"`` (a learned class token; its final state) or ``"mean"``
            (global average over the patch tokens).
        dropout: rate after the embeddings, inside every block and before the head.
        use_bias: biases on the blocks' projections.
        seed: seeds the dropout layers' random streams (each layer its own).
        megatron_sp: build the blocks Megatron sequence-parallel (layout tp+sp;
            the token count P (+1) must divide by the model axis).
        remat: every block's rematerialisation in training: ``"none"``, ``"full"`` or
            ``"dots_saveable"`` (``TransformerBlock``); memory and compute change, not the numbers.

    Outputs logits: compile with ``SparseCategoricalCrossentropy(from_logits=True)``.
    Named sizes: ``from_config_name("vit_tiny")`` (``VIT_CONFIGS``).

    Layouts (``get_layout_map``; with a config, tp+sp also checks the token count P (+1)):
    p x p patches of Ch channels, P patches, L = P + 1 with pooling="cls" else P, C
    hidden_dim, N num_classes; blocks ``block_<i>/...`` as in ``_transformer_layouts``;
    ``-`` = not split.

    =============================  ============  ============  ==============  =================
    path                           shape         fsdp          tp / tp+sp      fsdp+tp
    =============================  ============  ============  ==============  =================
    patch_embedding/kernel         (p, p, Ch, C) (-,-,-,data)  replicated      (-,-,-,data)
    patch_embedding/bias           (C,)          replicated    replicated      replicated
    class_token/token              (1, 1, C)     replicated    replicated      replicated
    position_embedding/embeddings  (L, C)        (-, data)     replicated      (-, data)
    final_norm/gamma, beta         (C,)          replicated    replicated      replicated
    classifier_head/kernel         (C, N)        (data, -)     (-, model) [1]  (data, model) [1]
    classifier_head/bias           (N,)          replicated    (model,) [1]    (model,) [1]
    =============================  ============  ============  ==============  =================

    [1] with ``config`` given and N divisible by the model axis; else not split
    over model. ``"data"`` has no rules: every weight replicated.
    """

    CONFIGS = VIT_CONFIGS

    def __init__(
        self,
        image_size,
        patch_size,
        num_classes,
        num_layers,
        num_query_heads,
        hidden_dim,
        intermediate_dim,
        channels=3,
        num_key_value_heads=None,
        mlp="gelu",
        norm="layer",
        layer_norm_epsilon=1e-6,
        pooling="cls",
        dropout=0.0,
        use_bias=True,
        seed=None,
        megatron_sp=False,
        remat="none",
        name="vit_classifier",
        **kwargs,
    ):
        image_size, patch_size = _as_pair(image_size, "image_size"), _as_pair(patch_size, "patch_size")
        sizes = dict(
            num_classes=num_classes,
            num_layers=num_layers,
            num_query_heads=num_query_heads,
            hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim,
            channels=channels,
        )
        check_common(sizes, pooling, dropout)
        # what ``classify`` builds the blocks and head from
        stack = stack_arguments(
            num_classes, num_layers, num_query_heads, hidden_dim, intermediate_dim, num_key_value_heads, mlp, norm,
            layer_norm_epsilon, pooling, dropout, use_bias, seed, megatron_sp, remat,
        )  # fmt: skip
        grid = _patch_grid(image_size, patch_size)
        images = keras.Input(shape=(*image_size, channels), name="images")  # (B, H, W, Ch)
        x = _embed(images, hidden_dim, patch_size, grid, pooling)  # (B, P (+1), C)
        logits = classify(x, key_mask=None, rotary=False, **stack)  # (B, num_classes)
        super().__init__(inputs=images, outputs=logits, name=name, **kwargs)
        self.keep_arguments(image_size=image_size, patch_size=patch_size, channels=channels, **stack)

    @property
    def num_patches(self):
        """P, the number of patch tokens (without the class token)."""
        grid = _patch_grid(self.image_size, self.patch_size)
        return grid[0] * grid[1]

    @classmethod
    def own_layout_rules(cls, layout, config):
        return {**layouts.patch_embedding_rules(layout), **layouts.position_embedding_rules(layout)}

    @classmethod
    def extra_layout_sizes(cls, layout, config):
        if not layouts.splits_sequence_over_model(layout):
            return {}
        what = "token count (patches + class token)" if config["pooling"] == "cls" else "patch count"
        return {(what, MODEL): _token_count(config)}


def _embed(images, hidden_dim, patch_size, grid, pooling):
    """Images (B, H, W, Ch) -> patch tokens with positions (B, P (+1), C)."""
    x = keras.layers.Conv2D(hidden_dim, patch_size, strides=patch_size, padding="valid", name="patch_embedding")(
        images
    )  # (B, H/p, W/p, C)
    x = keras.layers.Reshape((grid[0] * grid[1], hidden_dim), name="patch_sequence")(x)  # (B, P, C)
    if pooling == "cls":
        x = ClassToken(name="class_token")(x)  # (B, 1 + P, C)
    return LearnedPositionEmbedding(x.shape[1], name="position_embedding")(x)  # (B, P (+1), C)


def _token_count(config):
    grid = _patch_grid(_as_pair(config["image_size"], "image_size"), _as_pair(config["patch_size"], "patch_size"))
    return grid[0] * grid[1] + (config["pooling"] == "cls")


def _patch_grid(image_size, patch_size):
    """(H/p_h, W/p_w), raising with the numbers when a side does not divide."""
    for side, image, patch in zip(("height", "width"), image_size, patch_size):
        if image % patch:
            raise ValueError(
                f"image {side} {image} is not divisible by patch {side} {patch} (image_size {image_size}, patch_size {patch_size})"
            )
    return image_size[0] // patch_size[0], image_size[1] // patch_size[1]


def _as_pair(size, name):
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in pair):
        raise ValueError(f"{name} must be a positive int or (height, width) of positive ints, got {size!r}")
    return pair
