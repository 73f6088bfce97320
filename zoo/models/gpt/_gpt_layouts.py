"""GPT layout rules: the shared Transformer block rules plus the embedding and LM head.

Token embedding (V, C) and LM head kernel (C, V), per layout (``-`` = not split):

========  ==================  ==================
layout  token_embedding     lm_head/kernel
========  ==================  ==================
data      replicated          replicated
fsdp      (data, -)           (data, -)
tp, tp+sp (model, -)          (-, model)
fsdp+tp   (model, data)       (data, model)
========  ==================  ==================

Tensor parallelism splits the *vocabulary* of both (Megatron's vocab-parallel
embedding and column-parallel output layer): each device holds V/M rows of the table,
the lookup is a masked local gather plus one all-reduce of (B, T, C) that GSPMD
inserts, and the logits come out split on V, so the largest activation of a language
model, (B, T, V), is never whole on one device. Splitting the embedding on C instead
would leave the head's V unsplit (or need a different layout for the tied case). With
``tie_word_embeddings`` the head is the embedding table itself (``x @ E^T``), so the logits
are vocab-split the same way. FSDP splits the first dimension over ``data``; GSPMD
all-gathers the table where it is used.
"""

from zoo.distribution.axes import DATA, MODEL
from zoo.models import _transformer_layouts as shared

EMBEDDING = r".*token_embedding/embeddings"  # (V, C)
LM_HEAD = r".*lm_head/kernel"  # (C, V)


def gpt_rules(layout, *, with_head, mesh=None, data_axis=DATA, model_axis=MODEL):
    """{regex: layout axes} for a GPT backbone (and its untied LM head if ``with_head``).

    The blocks' rules are ``_transformer_layouts.block_rules`` (none where the blocks'
    tensor-parallel layers place their weights themselves, on ``mesh``)."""
    rules = shared.block_rules(layout, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    d = data_axis if shared.uses_data_axis_for_weights(layout) else None
    m = model_axis if shared.uses_model_axis(layout) else None
    if m is not None:
        rules[EMBEDDING] = (m, d)  # (V/M, C[/data])
        if with_head:
            rules[LM_HEAD] = (d, m)  # (C[/data], V/M)
    elif d is not None:
        rules[EMBEDDING] = (d, None)  # (V/data, C)
        if with_head:
            rules[LM_HEAD] = (d, None)  # (C/data, V)
    return rules


def check_config(mesh, layout, config, *, data_axis=DATA, model_axis=MODEL):
    """Raise ``LayoutError`` naming the numbers unless ``config``'s sizes split on ``mesh``
    (``config``: ``GPTBackbone`` arguments, new keys)."""
    heads = config["num_query_heads"]
    sizes = {
        "num_query_heads": heads,
        "intermediate_dim": config["intermediate_dim"],
        "vocabulary_size": config["vocabulary_size"],
        ("hidden_dim", data_axis): config["hidden_dim"],
    }
    if layout == "fsdp":
        sizes[("vocabulary_size", data_axis)] = config["vocabulary_size"]
    shared.check_divisible(mesh, layout, sizes, data_axis=data_axis, model_axis=model_axis)
    shared.check_kv_heads(mesh, layout, config.get("num_key_value_heads") or heads, model_axis=model_axis)
    if layout == "tp+sp" and not config.get("megatron_sp", False):
        raise ValueError(
            "layout 'tp+sp' needs a model built with megatron_sp=True, but the config has "
            "megatron_sp=False; build it with from_config_name(name, layout='tp+sp') or megatron_sp=True"
        )


def layout_map(mesh, layout, config, *, with_head, data_axis=DATA, model_axis=MODEL):
    """The ``LayoutMap`` for ``layout`` on ``mesh``, after checking ``config`` if given."""
    shared.check_layout(layout)
    if config is not None:
        check_config(mesh, layout, config, data_axis=data_axis, model_axis=model_axis)
    rules = gpt_rules(layout, with_head=with_head, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    return shared.build_layout_map(mesh, layout, rules, data_axis=data_axis, model_axis=model_axis)
