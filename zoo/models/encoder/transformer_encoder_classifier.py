"""The Transformer encoder classifier: token ids -> class logits (BERT-style, pre-norm)."""

import keras

from zoo.config.choices import POSITION_EMBEDDINGS
from zoo.distribution.axes import DATA, MODEL
from zoo.layers.class_token import ClassToken
from zoo.layers.learned_position_embedding import LearnedPositionEmbedding
from zoo.models import _classifier_layouts as layouts
from zoo.models._classifier_checks import check_common
from zoo.models.encoder.encoder_configs import ENCODER_CONFIGS
from zoo.models.encoder_classifier import EncoderClassifier, classify, stack_arguments


@keras.saving.register_keras_serializable(package="zoo")
class TransformerEncoderClassifier(EncoderClassifier):
    """Sequence classifier: embeddings, N non-causal ``TransformerBlock``s, pooling, head.

    ```
    token_ids (B, T) int32, pad_id = padding
      -> token_embedding (B, T, C)
      -> [class_token: (B, 1 + T, C), when pooling="cls"]
      -> [position_embedding: + learned (L, C) table, when position_embedding="learned"]
      -> embedding_dropout -> block_0 .. block_{N-1} (key_mask: token != pad_id)
      -> final_norm -> pooling (class token, or mean over non-padding tokens) (B, C)
      -> head_dropout -> classifier_head (B, num_classes)
    ```

    Padding never reaches a real token: the blocks' attention masks padded keys, and
    mean pooling averages only non-padding tokens, so the logits do not depend on what
    sits at padded positions or on how much padding follows the text.

    Args:
        vocabulary_size: V, token ids are in [0, V).
        num_classes: output logits.
        num_layers: N, Transformer blocks.
        num_query_heads: H, attention heads; must divide ``hidden_dim``.
        hidden_dim: C, the model width.
        intermediate_dim: F, the MLP's hidden features.
        max_sequence_length: longest input (tokens, not counting the class token); the
            learned position table has this many rows (one more with pooling="cls").
        num_key_value_heads: K, key/value heads (GQA); None means H.
        mlp: ``"gelu"``, ``"relu"``, ``"geglu"`` or ``"swiglu"`` (``TransformerBlock``).
        norm: ``"layer"`` or ``"rms"``; also the final norm.
        layer_norm_epsilon: the norms' epsilon.
        position_embedding: ``"learned"`` (a table added to the embeddings) or
            ``"rotary"`` (RoPE inside attention; no table).
        pooling: ``"mean"`` (masked mean over non-padding tokens) or ``"cls"`` (a
            learned class token prepended to every sequence; its final state).
        dropout: rate after the embeddings, inside every block and before the head.
        use_bias: biases on the blocks' projections.
        pad_id: the padding token id (``zoo.data.ByteTokenizer`` pads with 0).
        seed: seeds the dropout layers' random streams (each layer its own).
        megatron_sp: build the blocks Megatron sequence-parallel (layout tp+sp).
        remat: every block's rematerialisation in training: ``"none"``, ``"full"`` or
            ``"dots_saveable"`` (``TransformerBlock``); memory and compute change, not the numbers.

    Outputs logits: compile with ``SparseCategoricalCrossentropy(from_logits=True)``.
    Named sizes: ``from_config_name("encoder_tiny")`` (``ENCODER_CONFIGS``).

    Layouts (``get_layout_map``): V vocabulary, L = max_sequence_length (+1 with
    pooling="cls"), C hidden_dim, N num_classes; blocks ``block_<i>/...`` as in
    ``_transformer_layouts``; ``-`` = not split. A rotary model has no position table:
    pass its config under fsdp or fsdp+tp.

    =============================  ======  =========  ==============  =============
    path                           shape   fsdp       tp / tp+sp      fsdp+tp
    =============================  ======  =========  ==============  =============
    token_embedding/embeddings     (V, C)  (data, -)  (model, -)      (model, data)
    class_token/token              (1,1,C) replicated replicated      replicated
    position_embedding/embeddings  (L, C)  (-, data)  replicated      (-, data)
    final_norm/gamma, beta         (C,)    replicated replicated      replicated
    classifier_head/kernel         (C, N)  (data, -)  (-, model) [1]  (data, model) [1]
    classifier_head/bias           (N,)    replicated (model,) [1]    (model,) [1]
    =============================  ======  =========  ==============  =============

    [1] with ``config`` given and N divisible by the model axis; else not split
    over model. ``"data"`` has no rules: every weight replicated.
    """

    CONFIGS = ENCODER_CONFIGS

    def __init__(
        self,
        vocabulary_size,
        num_classes,
        num_layers,
        num_query_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=512,
        num_key_value_heads=None,
        mlp="gelu",
        norm="layer",
        layer_norm_epsilon=1e-5,
        position_embedding="learned",
        pooling="mean",
        dropout=0.0,
        use_bias=True,
        pad_id=0,
        seed=None,
        megatron_sp=False,
        remat="none",
        name="transformer_encoder_classifier",
        **kwargs,
    ):
        sizes = dict(
            vocabulary_size=vocabulary_size,
            num_classes=num_classes,
            max_sequence_length=max_sequence_length,
            num_layers=num_layers,
            num_query_heads=num_query_heads,
            hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim,
        )
        _check_config(sizes, position_embedding, pooling, dropout, pad_id)
        # what ``classify`` builds the blocks and head from
        stack = stack_arguments(
            num_classes, num_layers, num_query_heads, hidden_dim, intermediate_dim, num_key_value_heads, mlp, norm,
            layer_norm_epsilon, pooling, dropout, use_bias, seed, megatron_sp, remat,
        )  # fmt: skip
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")  # (B, T)
        x, key_mask = _embed(
            token_ids, vocabulary_size, hidden_dim, max_sequence_length, position_embedding, pooling, pad_id
        )
        logits = classify(x, key_mask=key_mask, rotary=position_embedding == "rotary", **stack)  # (B, num_classes)
        super().__init__(inputs=token_ids, outputs=logits, name=name, **kwargs)
        self.keep_arguments(
            vocabulary_size=vocabulary_size,
            max_sequence_length=max_sequence_length,
            position_embedding=position_embedding,
            pad_id=pad_id,
            **stack,
        )

    @classmethod
    def own_layout_rules(cls, layout, config):
        rules = layouts.token_embedding_rules(layout)
        if config is None or config["position_embedding"] == "learned":
            rules.update(layouts.position_embedding_rules(layout))
        return rules

    @classmethod
    def extra_layout_sizes(cls, layout, config):
        return {
            ("vocabulary_size", DATA if layout == "fsdp" else MODEL): config["vocabulary_size"]
        }  # over model (tp) or data (fsdp)


def _embed(token_ids, vocabulary_size, hidden_dim, max_sequence_length, position_embedding, pooling, pad_id):
    """Token ids (B, T) -> embeddings (B, T', C) and the key mask (B, T'), T' = T (+1 with a class token)."""
    key_mask = keras.ops.not_equal(token_ids, pad_id)  # (B, T) bool, True = real token
    x = keras.layers.Embedding(vocabulary_size, hidden_dim, name="token_embedding")(token_ids)  # (B, T, C)
    positions = max_sequence_length
    if pooling == "cls":
        x = ClassToken(name="class_token")(x)  # (B, 1 + T, C)
        key_mask = keras.ops.concatenate([keras.ops.ones_like(key_mask[:, :1]), key_mask], axis=1)  # (B, 1 + T)
        positions += 1
    if position_embedding == "learned":
        x = LearnedPositionEmbedding(positions, name="position_embedding")(x)  # (B, T', C)
    return x, key_mask


def _check_config(sizes, position_embedding, pooling, dropout, pad_id):
    check_common(sizes, pooling, dropout)
    if position_embedding not in POSITION_EMBEDDINGS:
        raise ValueError(f"position_embedding must be one of {list(POSITION_EMBEDDINGS)}, got {position_embedding!r}")
    if not 0 <= pad_id < sizes["vocabulary_size"]:
        raise ValueError(f"pad_id={pad_id} is not a token id in [0, vocabulary_size={sizes['vocabulary_size']})")
