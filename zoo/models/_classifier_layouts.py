"""Layout rules for the encoder-style classifiers' own weights (not the blocks').

``TransformerEncoderClassifier`` and ``ViTClassifier`` combine these with
``_transformer_layouts.block_rules``. The choices, per layout (``-`` = not split):

===============================  ============  ============  ================  =================
path                             shape         fsdp          tp / tp+sp        fsdp+tp
===============================  ============  ============  ================  =================
token_embedding/embeddings       (V, C)        (data, -)     (model, -)        (model, data)
position_embedding/embeddings    (T, C)        (-, data)     replicated        (-, data)
patch_embedding/kernel           (p,p,Ch,C)    (-,-,-,data)  replicated        (-,-,-,data)
classifier_head/kernel           (C, classes)  (data, -)     (-, model) [1]    (data, model) [1]
classifier_head/bias             (classes,)    replicated    (model,) [1]      (model,) [1]
===============================  ============  ============  ================  =================

Letters as in docs/architecture.md: V vocabulary, C model width, T positions (the
tokens; the ViT's patches, + 1 with a class token), N size of the ``model`` axis; p the
patch size, Ch the image's channels. Under tp the token embedding is vocabulary-parallel (Megatron): each device
holds V/N rows and the lookup ends in one all-reduce; the GPT models place it the same
way. The position and patch embeddings feed the residual stream, which tp keeps whole on
every model device, and are small (T x C, p^2 Ch x C), so tp replicates them; fsdp splits
them over data like every large weight.
Vectors (norms, biases, the class token) stay replicated.

[1] only when ``num_classes`` is known (``config`` given) and divisible by the model
axis; otherwise the head is replicated over model.
"""

from zoo.distribution.axes import DATA, MODEL
from zoo.distribution.layouts import LayoutError
from zoo.distribution.mesh import mesh_axis_size
from zoo.models._transformer_layouts import (
    block_rules,
    build_layout_map,
    check_divisible,
    check_kv_heads,
    splits_sequence_over_model,
    uses_data_axis_for_weights,
    uses_model_axis,
)


def split_axes(layout):
    """(data axis or None, model axis or None): the axes ``layout`` splits weights over."""
    return (DATA if uses_data_axis_for_weights(layout) else None, MODEL if uses_model_axis(layout) else None)


def token_embedding_rules(layout):
    """As the GPT models: vocabulary over model (tp), else the vocabulary over data (fsdp)."""
    d, m = split_axes(layout)
    return {r".*token_embedding/embeddings": (m, d) if m else (d, None)}  # (V, C)


def position_embedding_rules(layout):
    d, _ = split_axes(layout)
    return {r".*position_embedding/embeddings": (None, d)}  # (L, C)


def patch_embedding_rules(layout):
    d, _ = split_axes(layout)
    return {r".*patch_embedding/kernel": (None, None, None, d)}  # (p, p, Ch, C)


def head_rules(layout, mesh, num_classes):
    """The head's classes split over model only when ``num_classes`` is known and divides."""
    d, m = split_axes(layout)
    if m is not None and (num_classes is None or num_classes % mesh_axis_size(mesh, m)):
        m = None
    return {r".*classifier_head/kernel": (d, m), r".*classifier_head/bias": (m,)}  # (C, N), (N,)


def check_sizes(mesh, layout, config, extra_sizes=None):
    """Raise ``LayoutError`` naming the numbers unless ``config``'s sizes split evenly."""
    if splits_sequence_over_model(layout) and not config["megatron_sp"]:
        raise LayoutError(
            "layout 'tp+sp' needs the model built with megatron_sp=True "
            "(see _transformer_layouts.layout_overrides('tp+sp')), but the config has megatron_sp=False"
        )
    sizes = {
        "num_query_heads": config["num_query_heads"],
        "intermediate_dim": config["intermediate_dim"],
        ("hidden_dim", DATA): config["hidden_dim"],
        **(extra_sizes or {}),
    }
    check_divisible(mesh, layout, sizes)
    check_kv_heads(mesh, layout, config["num_key_value_heads"] or config["num_query_heads"])


def classifier_layout_map(mesh, layout, own_rules):
    """``build_layout_map`` of the block rules plus the model's ``own_rules``."""
    return build_layout_map(mesh, layout, {**block_rules(layout, mesh=mesh), **own_rules})
