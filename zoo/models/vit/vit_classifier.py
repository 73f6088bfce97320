"""The Vision Transformer classifier: images -> patches -> Transformer blocks -> logits."""

import keras

from zoo.distribution.axes import MODEL
from zoo.layers.transformer_block import check_remat
from zoo.models import _classifier_layouts as layouts
from zoo.models._class_token import ClassToken
from zoo.models._classifier_checks import check_common
from zoo.models._encoder_stack import classifier_head, encoder_stack, layer_seed
from zoo.models._learned_position_embedding import LearnedPositionEmbedding
from zoo.models._named_configs import complete_config, named_config
from zoo.models._transformer_layouts import config_overrides
from zoo.models.vit.vit_configs import VIT_CONFIGS


@keras.saving.register_keras_serializable(package="zoo")
class ViTClassifier(keras.Model):
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
        num_heads: H, attention heads; must divide ``hidden_dim``.
        hidden_dim: C, the model width.
        intermediate_dim: F, the MLP's hidden features.
        channels: Ch, image channels (3 for RGB; the name SmallCNN uses).
        num_kv_heads: K, key/value heads (GQA); None means H.
        mlp: ``"gelu"``, ``"relu"``, ``"geglu"`` or ``"swiglu"`` (``TransformerBlock``).
        norm: ``"layer"`` or ``"rms"``; also the final norm.
        norm_epsilon: the norms' epsilon (1e-6 as in ViT).
        pooling: ``"cls"`` (a learned class token; its final state) or ``"mean"``
            (global average over the patch tokens).
        dropout: rate after the embeddings, inside every block and before the head.
        use_bias: biases on the blocks' projections.
        seed: seeds the dropout layers' random streams (each layer its own).
        tp_sequence_parallel: build the blocks Megatron sequence-parallel (layout
            strategy ``"tp+sp"``; the token count P (+1) must divide by the model axis).
        remat: every block's rematerialisation in training: ``"none"``, ``"full"`` or
            ``"dots_saveable"`` (``TransformerBlock``); memory and compute change, not the numbers.

    Outputs logits: compile with ``SparseCategoricalCrossentropy(from_logits=True)``.
    """

    def __init__(
        self,
        image_size,
        patch_size,
        num_classes,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        channels=3,
        num_kv_heads=None,
        mlp="gelu",
        norm="layer",
        norm_epsilon=1e-6,
        pooling="cls",
        dropout=0.0,
        use_bias=True,
        seed=None,
        tp_sequence_parallel=False,
        remat="none",
        name="vit_classifier",
        **kwargs,
    ):
        image_size, patch_size = _as_pair(image_size, "image_size"), _as_pair(patch_size, "patch_size")
        sizes = dict(
            num_classes=num_classes, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim, channels=channels,
        )
        check_common(sizes, pooling, dropout)
        grid = _patch_grid(image_size, patch_size)
        images = keras.Input(shape=(*image_size, channels), name="images")  # (B, H, W, Ch)
        x = _embed(images, hidden_dim, patch_size, grid, pooling)  # (B, P (+1), C)
        x = keras.layers.Dropout(dropout, seed=layer_seed(seed, 0), name="embedding_dropout")(x)
        x = encoder_stack(
            x,
            key_mask=None,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim,
            rotary=False,
            mlp=mlp,
            norm=norm,
            norm_epsilon=norm_epsilon,
            dropout=dropout,
            use_bias=use_bias,
            tp_sequence_parallel=tp_sequence_parallel,
            seed=layer_seed(seed, 1),
            remat=check_remat(remat),
        )  # (B, P (+1), C), after final_norm
        logits = classifier_head(x, None, pooling, dropout, num_classes, layer_seed(seed, 2 * num_layers + 1))
        super().__init__(inputs=images, outputs=logits, name=name, **kwargs)

        self.image_size = image_size
        self.patch_size = patch_size
        self.num_classes = num_classes
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.channels = channels
        self.num_kv_heads = num_kv_heads
        self.mlp = mlp
        self.norm = norm
        self.norm_epsilon = norm_epsilon
        self.pooling = pooling
        self.dropout = dropout
        self.use_bias = use_bias
        self.seed = seed
        self.tp_sequence_parallel = bool(tp_sequence_parallel)
        self.remat = check_remat(remat)

    @property
    def num_patches(self):
        """P, the number of patch tokens (without the class token)."""
        grid = _patch_grid(self.image_size, self.patch_size)
        return grid[0] * grid[1]

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "image_size": list(self.image_size),
            "patch_size": list(self.patch_size),
            "num_classes": self.num_classes,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "channels": self.channels,
            "num_kv_heads": self.num_kv_heads,
            "mlp": self.mlp,
            "norm": self.norm,
            "norm_epsilon": self.norm_epsilon,
            "pooling": self.pooling,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "seed": self.seed,
            "tp_sequence_parallel": self.tp_sequence_parallel,
            "remat": self.remat,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def from_config_name(cls, name, strategy=None, **overrides):
        """The model of ``VIT_CONFIGS[name]`` with ``overrides`` replacing entries; with a
        layout ``strategy``, also the entries it needs (``"tp+sp"``: ``tp_sequence_parallel``).
        An unknown name raises, listing the names there are."""
        return cls(**named_config(VIT_CONFIGS, name, "ViT", strategy, overrides))

    @staticmethod
    def config_for_strategy(strategy, config):
        """A copy of ``config`` with the entries ``strategy`` needs (see ``config_overrides``)."""
        return {**config, **config_overrides(strategy)}

    @classmethod
    def get_layout_map(cls, mesh, strategy="tp", config=None):
        """A ``LayoutMap`` for ``strategy`` (see ``zoo.models._transformer_layouts``).

        Args:
            mesh: the ``keras.distribution.DeviceMesh``; needs the ``data`` axis for
                fsdp, the ``model`` axis for tp, tp+sp and fsdp+tp.
            strategy: ``"data"``, ``"fsdp"``, ``"tp"``, ``"tp+sp"`` or ``"fsdp+tp"``.
            config: None, a name in ``VIT_CONFIGS`` or a dict of ``__init__``
                arguments (``model.get_config()``). When given, every size is checked
                against the mesh up front (``LayoutError`` naming the numbers; under
                tp+sp also the token count P (+1)), and the head is split over the
                model axis when ``num_classes`` divides.

        Variable paths (p x p patches of Ch channels, P patches, L = P + 1 with
        pooling="cls" else P, C hidden_dim, N num_classes; blocks ``block_<i>/...`` as
        in ``_transformer_layouts``; ``-`` = not split):

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
        config = None if config is None else complete_config(cls, VIT_CONFIGS, config, "ViT")
        if config is not None:
            extra = {}
            if strategy == "tp+sp":
                tokens = _token_count(config)
                extra[("token count (patches + class token)" if config["pooling"] == "cls" else "patch count", MODEL)] = tokens
            layouts.check_sizes(mesh, strategy, config, extra)
        rules = {
            **layouts.patch_embedding_rules(strategy),
            **layouts.position_embedding_rules(strategy),
            **layouts.head_rules(strategy, mesh, None if config is None else config["num_classes"]),
        }
        return layouts.classifier_layout_map(mesh, strategy, rules)


def _embed(images, hidden_dim, patch_size, grid, pooling):
    """Images (B, H, W, Ch) -> patch tokens with positions (B, P (+1), C)."""
    x = keras.layers.Conv2D(
        hidden_dim, patch_size, strides=patch_size, padding="valid", name="patch_embedding"
    )(images)  # (B, H/p, W/p, C)
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
            raise ValueError(f"image {side} {image} is not divisible by patch {side} {patch} (image_size {image_size}, patch_size {patch_size})")
    return image_size[0] // patch_size[0], image_size[1] // patch_size[1]


def _as_pair(size, name):
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in pair):
        raise ValueError(f"{name} must be a positive int or (height, width) of positive ints, got {size!r}")
    return pair
