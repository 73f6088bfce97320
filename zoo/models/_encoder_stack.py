"""What the encoder-style classifiers share: the non-causal block stack and the pooled head."""

import keras

from zoo.layers.transformer_block import TransformerBlock
from zoo.models._token_pooling import TokenPooling


def encoder_stack(
    x,
    *,
    key_mask,
    num_layers,
    num_heads,
    num_kv_heads,
    hidden_dim,
    intermediate_dim,
    rotary,
    mlp,
    norm,
    norm_epsilon,
    dropout,
    use_bias,
    tp_sequence_parallel,
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
            num_heads=num_heads,
            head_dim=hidden_dim // num_heads,
            hidden_dim=intermediate_dim,
            num_kv_heads=num_kv_heads,
            causal=False,
            rotary=rotary,
            mlp=mlp,
            norm=norm,
            norm_epsilon=norm_epsilon,
            dropout=dropout,
            use_bias=use_bias,
            tp_sequence_parallel=tp_sequence_parallel,
            seed=layer_seed(seed, 2 * index),
            remat=remat,
            name=f"block_{index}",
        )
        x = block(x) if key_mask is None else block(x, key_mask=key_mask)  # (B, T, C)
    if norm == "rms":
        return keras.layers.RMSNormalization(epsilon=norm_epsilon, name="final_norm")(x)  # (B, T, C)
    return keras.layers.LayerNormalization(epsilon=norm_epsilon, name="final_norm")(x)  # (B, T, C)


def classifier_head(x, key_mask, pooling, dropout, num_classes, seed):
    """``pooling`` -> ``head_dropout`` -> ``classifier_head``: (B, T, C) -> logits (B, num_classes)."""
    pool = TokenPooling(pooling, name="pooling")
    pooled = pool(x) if key_mask is None else pool(x, key_mask=key_mask)  # (B, C)
    pooled = keras.layers.Dropout(dropout, seed=seed, name="head_dropout")(pooled)  # (B, C)
    return keras.layers.Dense(num_classes, name="classifier_head")(pooled)  # (B, num_classes)


def layer_seed(seed, offset):
    """``seed + offset``, or None for an unseeded model."""
    return None if seed is None else seed + offset
