"""What the encoder-style classifiers share (``TransformerEncoderClassifier``, ``ViTClassifier``).

The embedded tokens go through ``classify`` (embedding dropout, the non-causal block
stack, pooling, the head), and both models are ``EncoderClassifier``s: config, named
configs and the layout map come from here; each model adds its own embedding rules.
"""

import keras

from zoo.layers.token_pooling import TokenPooling
from zoo.layers.transformer_block import TransformerBlock, check_remat
from zoo.models import _classifier_layouts as layouts
from zoo.models._named_configs import complete_config
from zoo.models.zoo_model import ZooModel


class EncoderClassifier(ZooModel):
    """Base of the encoder-style classifiers: ``get_layout_map`` from the shared block and
    head rules plus the model's ``own_layout_rules`` and ``extra_layout_sizes``."""

    @classmethod
    def get_layout_map(cls, mesh, layout="tp", config=None):
        """A ``LayoutMap`` for ``layout`` (see ``zoo.models._transformer_layouts``).

        Args:
            mesh: the ``keras.distribution.DeviceMesh``; needs the ``data`` axis for
                fsdp, the ``model`` axis for tp, tp+sp and fsdp+tp.
            layout: data, fsdp, tp, tp+sp or fsdp+tp (``zoo.config.layouts``).
            config: None, a name in ``CONFIGS`` or a dict of ``__init__`` arguments
                (``model.get_config()``). When given, every size is checked against the
                mesh up front (``LayoutError`` naming the numbers) and the head is split
                over the model axis when ``num_classes`` divides.

        The model's class docstring lists its variable paths and their layouts.
        """
        config = None if config is None else complete_config(cls, cls.CONFIGS, config, cls.__name__)
        if config is not None:
            layouts.check_sizes(mesh, layout, config, cls.extra_layout_sizes(layout, config))
        rules = {
            **cls.own_layout_rules(layout, config),
            **layouts.head_rules(layout, mesh, None if config is None else config["num_classes"]),
        }
        return layouts.classifier_layout_map(mesh, layout, rules)

    @classmethod
    def own_layout_rules(cls, layout, config):
        """{regex: layout axes} for the model's embeddings (``config`` may be None)."""
        raise NotImplementedError

    @classmethod
    def extra_layout_sizes(cls, layout, config):
        """{(name, mesh axis): size} the model needs divisible besides the blocks' sizes."""
        return {}


def stack_arguments(
    num_classes, num_layers, num_query_heads, hidden_dim, intermediate_dim, num_key_value_heads, mlp, norm,
    layer_norm_epsilon, pooling, dropout, use_bias, seed, megatron_sp, remat,
):  # fmt: skip
    """What ``classify`` builds the blocks and head from, as a classifier keeps it in its
    config: ``megatron_sp`` as a bool, ``remat`` checked."""
    return dict(
        num_classes=num_classes, num_layers=num_layers, num_query_heads=num_query_heads, hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim, num_key_value_heads=num_key_value_heads, mlp=mlp, norm=norm,
        layer_norm_epsilon=layer_norm_epsilon, pooling=pooling, dropout=dropout, use_bias=use_bias, seed=seed,
        megatron_sp=bool(megatron_sp), remat=check_remat(remat),
    )  # fmt: skip


def classify(
    x,
    *,
    key_mask,
    rotary,
    pooling,
    num_classes,
    num_layers,
    num_query_heads,
    num_key_value_heads,
    hidden_dim,
    intermediate_dim,
    mlp,
    norm,
    layer_norm_epsilon,
    dropout,
    use_bias,
    megatron_sp,
    seed,
    remat,
):
    """Embedded tokens (B, T, C) -> logits (B, num_classes): ``embedding_dropout``,
    ``encoder_stack``, then ``classifier_head``. Seeds: the embedding dropout ``seed``, the
    blocks from ``seed + 1``, the head dropout ``seed + 2 num_layers + 1`` (None: unseeded)."""
    x = keras.layers.Dropout(dropout, seed=layer_seed(seed, 0), name="embedding_dropout")(x)  # (B, T, C)
    x = encoder_stack(
        x,
        key_mask=key_mask,
        num_layers=num_layers,
        num_query_heads=num_query_heads,
        num_key_value_heads=num_key_value_heads,
        hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim,
        rotary=rotary,
        mlp=mlp,
        norm=norm,
        layer_norm_epsilon=layer_norm_epsilon,
        dropout=dropout,
        use_bias=use_bias,
        megatron_sp=megatron_sp,
        seed=layer_seed(seed, 1),
        remat=remat,
    )  # (B, T, C), after final_norm
    return classifier_head(x, key_mask, pooling, dropout, num_classes, layer_seed(seed, 2 * num_layers + 1))


def encoder_stack(
    x,
    *,
    key_mask,
    num_layers,
    num_query_heads,
    num_key_value_heads,
    hidden_dim,
    intermediate_dim,
    rotary,
    mlp,
    norm,
    layer_norm_epsilon,
    dropout,
    use_bias,
    megatron_sp,
    seed,
    remat="none",
):
    """``block_0`` .. ``block_{N-1}`` (non-causal ``TransformerBlock``s), then ``final_norm``.

    x (B, T, C) symbolic -> (B, T, C). Block i seeds its two dropout layers with
    ``seed + 2 i`` and ``seed + 2 i + 1`` (None: unseeded). ``remat``: every block's
    rematerialisation (``TransformerBlock``).
    """
    for index in range(num_layers):
        block = TransformerBlock(
            num_heads=num_query_heads,
            head_dim=hidden_dim // num_query_heads,
            hidden_dim=intermediate_dim,
            num_kv_heads=num_key_value_heads,
            causal=False,
            rotary=rotary,
            mlp=mlp,
            norm=norm,
            norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            use_bias=use_bias,
            megatron_sp=megatron_sp,
            seed=layer_seed(seed, 2 * index),
            remat=remat,
            name=f"block_{index}",
        )
        x = block(x) if key_mask is None else block(x, key_mask=key_mask)  # (B, T, C)
    if norm == "rms":
        return keras.layers.RMSNormalization(epsilon=layer_norm_epsilon, name="final_norm")(x)  # (B, T, C)
    return keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="final_norm")(x)  # (B, T, C)


def classifier_head(x, key_mask, pooling, dropout, num_classes, seed):
    """``pooling`` -> ``head_dropout`` -> ``classifier_head``: (B, T, C) -> logits (B, num_classes)."""
    pool = TokenPooling(pooling, name="pooling")
    pooled = pool(x) if key_mask is None else pool(x, key_mask=key_mask)  # (B, C)
    pooled = keras.layers.Dropout(dropout, seed=seed, name="head_dropout")(pooled)  # (B, C)
    return keras.layers.Dense(num_classes, name="classifier_head")(pooled)  # (B, num_classes)


def layer_seed(seed, offset):
    """``seed + offset``, or None for an unseeded model."""
    return None if seed is None else seed + offset
