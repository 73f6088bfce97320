"""GPT layout rules: the shared Transformer block rules plus the embedding and LM head.

Token embedding (V, C) and LM head kernel (C, V), per strategy (``-`` = not split):

========  ==================  ==================
strategy  token_embedding     lm_head/kernel
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
``tie_embeddings`` the head is the embedding table itself (``x @ E^T``), so the logits
are vocab-split the same way. FSDP splits the first dimension over ``data``; GSPMD
all-gathers the table where it is used.
"""

from zoo.distribution.axes import DATA, MODEL
from zoo.models import _transformer_layouts as shared

EMBEDDING = r".*token_embedding/embeddings"  # (V, C)
LM_HEAD = r".*lm_head/kernel"  # (C, V)


def gpt_rules(strategy, *, with_head, mesh=None, data_axis=DATA, model_axis=MODEL):
    """{regex: layout axes} for a GPT backbone (and its untied LM head if ``with_head``).

    The blocks' rules are ``_transformer_layouts.block_rules`` (none where the blocks'
    tensor-parallel layers place their weights themselves, on ``mesh``)."""
    rules = shared.block_rules(strategy, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    d = data_axis if shared.uses_data_axis_for_weights(strategy) else None
    m = model_axis if shared.uses_model_axis(strategy) else None
    if m is not None:
        rules[EMBEDDING] = (m, d)  # (V/M, C[/data])
        if with_head:
            rules[LM_HEAD] = (d, m)  # (C[/data], V/M)
    elif d is not None:
        rules[EMBEDDING] = (d, None)  # (V/data, C)
        if with_head:
            rules[LM_HEAD] = (d, None)  # (C/data, V)
    return rules


def check_config(mesh, strategy, config, *, data_axis=DATA, model_axis=MODEL):
    """Raise ``LayoutError`` naming the numbers unless ``config``'s sizes split on ``mesh``."""
    heads = config["num_heads"]
    sizes = {
        "num_heads": heads,
        "intermediate_dim": config["intermediate_dim"],
        "vocabulary_size": config["vocabulary_size"],
        ("hidden_dim", data_axis): config["hidden_dim"],
    }
    if strategy == "fsdp":
        sizes[("vocabulary_size", data_axis)] = config["vocabulary_size"]
    shared.check_divisible(mesh, strategy, sizes, data_axis=data_axis, model_axis=model_axis)
    shared.check_kv_heads(mesh, strategy, config.get("num_kv_heads") or heads, model_axis=model_axis)
    if strategy == "tp+sp" and not config.get("tp_sequence_parallel", False):
        raise ValueError(
            "layout strategy 'tp+sp' needs a model built with tp_sequence_parallel=True, but the "
            "config has tp_sequence_parallel=False; build it from config_for_strategy('tp+sp', config)"
        )


def layout_map(mesh, strategy, config, *, with_head, data_axis=DATA, model_axis=MODEL):
    """The ``LayoutMap`` for ``strategy`` on ``mesh``, after checking ``config`` if given."""
    shared.check_strategy(strategy)
    if config is not None:
        check_config(mesh, strategy, config, data_axis=data_axis, model_axis=model_axis)
    rules = gpt_rules(strategy, with_head=with_head, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    return shared.build_layout_map(mesh, strategy, rules, data_axis=data_axis, model_axis=model_axis)
