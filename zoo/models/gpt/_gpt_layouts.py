"""GPT layout rules: the shared Transformer block rules plus the embedding and LM head.

Token embedding (V, C) and LM head kernel (C, V), per layout (``-`` = not split):

========  ==================  ==================
layout  token_embedding     lm_head/kernel
========  ==================  ==================
data      replicated          replicated
fsdp      (data, -)           (-, data) [2]
tp, tp+sp (model, -)          (-, model)
fsdp+tp   (model, data)       (data, model)
pipeline  (model, -) [1]      (-, model) [1]
========  ==================  ==================

[1] only on a mesh with a ``model`` axis; replicated without one.
[2] split on V like the table, so that either head can gather its weight or the global
batch's activations, whichever moves fewer bytes (``zoo.layers.lm_head_gather``).

Layout ``pipeline`` (a backbone built with a ``schedule``: one ``PipelinedBlocks``
named ``blocks``, every block weight stacked (R, L/R, ...)): dimension 1 (the blocks of
a repeat) over ``stage``, and with a ``model`` axis Megatron's split of the rest
(``_stacked_block_rules``); the batch over ``data``. A backbone built with ``scan_layers``
(the same ``PipelinedBlocks``, one stage) takes the same rules behind (1, L), under
``SCANNED_LAYOUTS``: the model axis' split as above, the data axis' as fsdp's.

Tensor parallelism splits the *vocabulary* of both (Megatron's vocab-parallel
embedding and column-parallel output layer): each device holds V/model rows of the table,
the lookup is a masked local gather plus one all-reduce of (B, T, C) that GSPMD
inserts, and the logits come out split on V, so the largest activation of a language
model, (B, T, V), is never whole on one device. Splitting the embedding on C instead
would leave the head's V unsplit (or need a different layout for the tied case). With
``tie_word_embeddings`` the head is the embedding table itself (``x @ E^T``), so the logits
are vocab-split the same way. FSDP splits V over ``data``, the axis the batch is split
over; the head then gathers either its weight (V x C elements) or the global batch's
hidden states (B x T x C), whichever is smaller (``GPTCausalLM.lm_head_gather``), and
GSPMD all-gathers the table for the lookup as it sees fit.
"""

import keras

from zoo.config.layouts import LAYOUT_TABLE, layout_record
from zoo.distribution.axes import DATA, EXPERT, MODEL, STAGE
from zoo.distribution.layouts import LayoutError, mark_stacked_weights, mark_weight_shard_axis
from zoo.distribution.mesh import describe_mesh, mesh_axis_size, require_axes
from zoo.models import _transformer_layouts as shared

EMBEDDING = r".*token_embedding/embeddings"  # (V, C)
LM_HEAD = r".*lm_head/kernel"  # (C, V)
EXPERT_IN = r".*mlp/expert_(gate|up)"  # (E, C, F)
EXPERT_OUT = r".*mlp/expert_down"  # (E, F, C)
STACKED_BLOCKS = r".*blocks/"  # the weights of a stacked backbone's PipelinedBlocks: (R, L/R, *a block's shape)


def expert_base_layout(layout):
    """The layout whose rules an expert layout's dense weights take: fsdp (fsdp+expert),
    tp (expert+tp) or data (expert)."""
    record = layout_record(layout)
    return "fsdp" if record.fsdp_axis else "tp" if record.model_axis else "data"


def gpt_rules(layout, *, with_head, mesh=None, data_axis=DATA, model_axis=MODEL, moe=False, expert_axis=None):
    """{regex: layout axes} for a GPT backbone (and its untied LM head if ``with_head``).

    The blocks' rules are ``_transformer_layouts.block_rules`` (none where the blocks'
    tensor-parallel layers place their weights themselves, on ``mesh``); with ``moe``
    the experts' (E, C, F) weights too: E over ``expert_axis`` (None: whole), F over
    the model axis and C over data as the layout splits the dense MLP's."""
    rules = shared.block_rules(layout, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    d = data_axis if shared.uses_data_axis_for_weights(layout) else None
    m = model_axis if shared.uses_model_axis(layout) else None
    if moe:  # the experts as MoEFeedForward's shard_map takes them (its weight_shard_axis only under fsdp+tp)
        _moe_block_rules(rules, moe if isinstance(moe, dict) else {})
        rules[EXPERT_IN] = (expert_axis, d, m)  # (E[/N_e], C[/data], F[/model])
        rules[EXPERT_OUT] = (expert_axis, m, d)  # (E[/N_e], F[/model], C[/data])
    if m is not None:
        rules[EMBEDDING] = (m, d)  # (V/model, C[/data])
        if with_head:
            rules[LM_HEAD] = (d, m)  # (C[/data], V/model)
    elif d is not None:
        rules[EMBEDDING] = (d, None)  # (V/data, C)
        if with_head:  # V split, as the table's: the head gathers the kernel or the activations (LMHeadGather)
            rules[LM_HEAD] = (None, d)  # (C, V/data)
    return rules


DENSE_MLP_RULES = (r"mlp/(gate|up)/kernel", r"mlp/down/kernel")  # behind a prefix (".*", a stack's ".*blocks/")


def _moe_block_rules(rules, config, prefix=".*"):
    """The dense MLP's rules (``prefix`` + ``DENSE_MLP_RULES``) also for a shared expert
    (``mlp/shared_expert/...``), and left out when ``config`` (a MoE config) has no dense
    block to match."""
    every_block_sparse = config.get("moe_layers") is None or len(config["moe_layers"]) == config.get("num_layers")
    for pattern in (prefix + rule for rule in DENSE_MLP_RULES):
        if pattern not in rules:
            continue
        if config.get("shared_expert_dim"):
            rules[pattern.replace("mlp/", "mlp/shared_expert/")] = rules[pattern]
        if config and every_block_sparse:
            del rules[pattern]


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
    if shared.splits_sequence_over_model(layout) and not config.get("megatron_sp", False):
        raise ValueError(
            "layout 'tp+sp' needs a model built with megatron_sp=True, but the config has "
            "megatron_sp=False; build it with from_config_name(name, layout='tp+sp') or megatron_sp=True"
        )


def layout_map(mesh, layout, config, *, with_head, data_axis=DATA, model_axis=MODEL):
    """The ``LayoutMap`` for ``layout`` on ``mesh``, after checking ``config`` if given."""
    record = LAYOUT_TABLE.get(layout)  # None: check_layout names the choices
    if record is not None and record.stage_axis:
        return pipeline_layout_map(mesh, config, with_head=with_head, model_axis=model_axis)
    if record is not None and record.expert_axis:
        return expert_layout_map(mesh, layout, config, with_head=with_head, data_axis=data_axis, model_axis=model_axis)
    shared.check_layout(layout)
    if config is not None:
        check_config(mesh, layout, config, data_axis=data_axis, model_axis=model_axis)
    if config is not None and config.get("scan_layers"):
        return scanned_layout_map(mesh, layout, config, with_head=with_head, data_axis=data_axis, model_axis=model_axis)
    moe = config if config is not None and config.get("num_experts") else config is None
    rules = gpt_rules(layout, with_head=with_head, mesh=mesh, data_axis=data_axis, model_axis=model_axis, moe=moe)
    if config is None:  # no config: the expert rules only where a model has experts to match
        rules = {key: axes for key, axes in rules.items() if key not in (EXPERT_IN, EXPERT_OUT)}
    return shared.build_layout_map(mesh, layout, rules, data_axis=data_axis, model_axis=model_axis)


def check_expert_config(mesh, layout, config, *, data_axis=DATA, model_axis=MODEL):
    """Raise ``LayoutError`` naming the numbers unless a MoE ``config`` splits on ``mesh``."""
    experts = config.get("num_experts") or 0
    if not experts:
        raise LayoutError(
            f"layout {layout!r} splits the experts of a Mixture-of-Experts model over {EXPERT!r}, but the config has "
            f"num_experts={experts}; build a MoE GPT (num_experts > 0, e.g. from_config_name('gpt_tiny_moe'))"
        )
    split = mesh_axis_size(mesh, EXPERT)
    if experts % split:
        raise LayoutError(
            f"layout {layout!r}: num_experts={experts} is not divisible by the {EXPERT!r} mesh axis of size {split} "
            f"(mesh {describe_mesh(mesh)}); choose an expert axis that divides {experts}"
        )
    base = expert_base_layout(layout)
    check_config(mesh, base, config, data_axis=data_axis, model_axis=model_axis)
    moe_width = config.get("moe_intermediate_dim") or config["intermediate_dim"]
    shared.check_divisible(mesh, base, {"moe_intermediate_dim": moe_width}, data_axis=data_axis, model_axis=model_axis)


def expert_layout_map(mesh, layout, config, *, with_head, data_axis=DATA, model_axis=MODEL):
    """The ``LayoutMap`` of an expert layout: ``expert`` (dense weights replicated),
    ``fsdp+expert`` (dense weights FSDP over data, the experts' C too, gathered inside
    the MoE layer) or ``expert+tp`` (Megatron over model, the experts' F too). The mesh
    needs ``data`` and ``expert`` (and ``model`` for ``expert+tp``); use the distribution
    from ``zoo.distribution.distribution_for`` (``ExpertParallel``: the batch over
    data x expert)."""
    base = expert_base_layout(layout)
    require_axes(mesh, [data_axis, EXPERT] + ([model_axis] if base == "tp" else []), f"layout {layout!r}")
    if config is not None:
        check_expert_config(mesh, layout, config, data_axis=data_axis, model_axis=model_axis)
    if config is not None and config.get("scan_layers"):
        rules = _scanned_expert_rules(
            mesh, base, config, with_head=with_head, data_axis=data_axis, model_axis=model_axis
        )
    elif base == "data":  # dense weights replicated, the experts split on E
        rules = {EXPERT_IN: (EXPERT, None, None), EXPERT_OUT: (EXPERT, None, None)}
    else:  # fsdp: the experts' C over data too (gathered in the MoE layer); tp: their F over model
        rules = gpt_rules(
            base,
            with_head=with_head,
            mesh=mesh,
            data_axis=data_axis,
            model_axis=model_axis,
            moe=config or True,
            expert_axis=EXPERT,
        )
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in rules.items():
        if any(axis is not None for axis in axes):
            layout_map[pattern] = axes
    if base == "fsdp":
        mark_weight_shard_axis(layout_map, data_axis)
    if config is not None and config.get("scan_layers"):
        mark_stacked_weights(layout_map, STACKED_BLOCKS, lead=2)
    return layout_map


def _scanned_expert_rules(mesh, base, config, *, with_head, data_axis, model_axis):
    """{regex: axes} of a MoE backbone built with ``scan_layers`` (every block sparse) under
    an expert layout whose dense weights take ``base``'s rules (data, fsdp or tp): the
    stacked blocks' as ``_stacked_block_rules`` (the dense MLP's are the shared expert's),
    the experts' E over ``expert`` behind (1, L), and the embedding and head as the layer
    form's."""
    d = data_axis if base == "fsdp" else None
    m = model_axis if base == "tp" else None
    head = (
        {}
        if base == "data"
        else gpt_rules(base, with_head=with_head, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    )
    rules = {pattern: axes for pattern, axes in head.items() if pattern in (EMBEDDING, LM_HEAD)}
    rules |= _stacked_block_rules((None, None), config, mesh, model_axis=m, data_axis=d)
    _moe_block_rules(rules, config, prefix=STACKED_BLOCKS)  # the dense MLP's rules: the shared expert's
    rules[r".*blocks/mlp/expert_(gate|up)"] = (None, None, EXPERT, d, m)  # (1, L, E/N_e, C[/data], F[/model])
    rules[r".*blocks/mlp/expert_down"] = (None, None, EXPERT, m, d)  # (1, L, E/N_e, F[/model], C[/data])
    return rules


def _stacked_block_rules(lead, config, mesh, *, model_axis=None, data_axis=None):
    """{regex: axes} for the stacked (R, L/R, ...) weights of a ``PipelinedBlocks`` named
    ``blocks``: ``lead`` the axes of the two stacking dimensions; behind them, with
    ``model_axis`` Megatron's split (the heads and the MLP's hidden features over it; the
    key/value heads only when they divide over it, else whole as the layer form keeps
    them), with ``data_axis`` FSDP's (each matrix's C over it). Norms and qk-norm scales
    stay whole behind ``lead``. ``config``: the backbone's arguments (None: K splits)."""
    m, d = model_axis, data_axis
    kv_heads = None if config is None else (config.get("num_key_value_heads") or config["num_query_heads"])
    kv = m if m is not None and (kv_heads is None or kv_heads % mesh_axis_size(mesh, m) == 0) else None
    rules = {  # (R, L/R, ...): the layer form's matrices behind the two stacking dimensions
        **shared.block_matrix_rules(prefix=".*blocks/", lead=lead, data_axis=d, model_axis=m, kv_axis=kv),
        r".*blocks/(attention|mlp)(_post)?_norm/(scale|gamma|beta)": (*lead, None),  # (R, L/R, C)
    }
    if config is not None and config.get("qkv_bias", False):
        rules[r".*blocks/attention/query/bias"] = (*lead, m, None)  # (R, L/R, H, D)
        rules[r".*blocks/attention/(key|value)/bias"] = (*lead, kv, None)  # (R, L/R, K, D)
    if config is not None and config.get("qk_norm", False):
        rules[r".*blocks/attention/(query|key)_norm/scale"] = (*lead, None)  # (R, L/R, D): whole on every device
    return rules


def scanned_layout_map(mesh, layout, config, *, with_head, data_axis=DATA, model_axis=MODEL):
    """The ``LayoutMap`` of a backbone built with ``scan_layers`` (one ``PipelinedBlocks``
    named ``blocks``, weights (1, L, ...)), under ``SCANNED_LAYOUTS``: ``data`` replicates
    the blocks, ``fsdp`` splits each matrix's C over data, ``tp`` and ``tp+sp`` Megatron's
    split over model, ``fsdp+tp`` both (``_stacked_block_rules`` behind the two stacking
    dimensions); the embedding and head as the layer form's. The map marks the stacking
    dimensions (``mark_stacked_weights``: ``context`` takes the ``data`` map and splits
    each weight over seq behind them). The loop gathers one block's weights per
    iteration over the data axis and keeps the model axis' split (``PipelinedBlocks``)."""
    head = gpt_rules(layout, with_head=with_head, mesh=mesh, data_axis=data_axis, model_axis=model_axis)
    split = shared.layers_place_weights(layout, mesh, model_axis=model_axis)  # a model axis of size > 1
    blocks = _stacked_block_rules(
        (None, None),
        config,
        mesh,
        model_axis=model_axis if split else None,
        data_axis=data_axis if shared.uses_data_axis_for_weights(layout) else None,
    )
    rules = {pattern: axes for pattern, axes in head.items() if pattern in (EMBEDDING, LM_HEAD)} | blocks
    layout_map = shared.build_layout_map(mesh, layout, rules, data_axis=data_axis, model_axis=model_axis)
    return mark_stacked_weights(layout_map, STACKED_BLOCKS, lead=2)  # context's split over seq behind (1, L)


def check_pipeline_config(mesh, config, *, model_axis=MODEL):
    """Raise naming the numbers unless ``config`` (a pipelined backbone's) fits ``mesh``."""
    if config.get("schedule") is None:
        raise LayoutError(
            "layout 'pipeline' needs a backbone built with a schedule ('gpipe' or 'circular'): its blocks are one "
            "PipelinedBlocks with stacked weights; build it with from_config_name(name, layout='pipeline') or schedule=..."
        )
    stages, repeats, layers = mesh_axis_size(mesh, STAGE), config.get("repeats", 1), config["num_layers"]
    if layers % (stages * repeats):
        raise LayoutError(
            f"layout 'pipeline': num_layers={layers} does not split into {repeats} repeat(s) x {stages} stages "
            f"(mesh {describe_mesh(mesh)}); choose a stage count and repeats whose product divides {layers}"
        )
    model = mesh_axis_size(mesh, model_axis) if model_axis in mesh.axis_names else 1
    sizes = {
        "num_query_heads": config["num_query_heads"],
        "intermediate_dim": config["intermediate_dim"],
        "vocabulary_size": config["vocabulary_size"],
    }
    for name, size in sizes.items():
        if size % model:
            raise LayoutError(
                f"layout 'pipeline': {name}={size} is not divisible by the {model_axis!r} mesh axis of size {model} "
                f"(mesh {describe_mesh(mesh)})"
            )
    shared.check_kv_heads(
        mesh, "tp", config.get("num_key_value_heads") or config["num_query_heads"], model_axis=model_axis
    )


def pipeline_layout_map(mesh, config, *, with_head, model_axis=MODEL):
    """The ``LayoutMap`` of layout ``pipeline``: the mesh needs ``data`` and ``stage``
    (``model`` optional: Megatron inside each stage)."""
    require_axes(mesh, [DATA, STAGE], "layout 'pipeline'")
    if config is not None:
        check_pipeline_config(mesh, config, model_axis=model_axis)
    model = mesh_axis_size(mesh, model_axis) if model_axis in mesh.axis_names else 1
    m = model_axis if model > 1 else None
    rules = _stacked_block_rules((None, STAGE), config, mesh, model_axis=m)
    if m is not None:
        rules[EMBEDDING] = (m, None)  # (V/model, C)
        if with_head:
            rules[LM_HEAD] = (None, m)  # (C, V/model)
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in rules.items():
        layout_map[pattern] = axes
    return mark_stacked_weights(layout_map, STACKED_BLOCKS, lead=2)  # an int4 kernel's parts behind (R, L/R)
