"""Layout strategies shared by the Transformer models (GPT, encoder classifier, ViT).

Each model's ``get_layout_map(mesh, strategy=..., config=None)`` is built here from the
rules every ``zoo.layers.TransformerBlock`` needs plus the model's own rules (its
embeddings and head). Strategies:

========  ================================================================================
data      no rules: every weight replicated (use with ``DataParallel``)
fsdp      every large weight split over the data axis (ZeRO-3 / FSDP); GSPMD all-gathers
          each weight where it is used. The optimizer's slots copy their variable's
          layout, so optimizer state is split the same way.
tp        Megatron tensor parallelism over the model axis: attention heads split
          (query/key/value column-parallel, output row-parallel); the MLP is a
          ``ParallelMLP``, which places its own weights (column up/gate, row down), so no
          MLP rule appears here.
tp+sp     as ``tp``, and the model is built with ``tp_sequence_parallel=True``: the
          residual stream, norms and dropout run split on the sequence over the model
          axis (Megatron sequence parallelism). Same weight layouts as ``tp``.
fsdp+tp   ``tp`` on the model axis, plus the attention and embedding weights split over
          the data axis on the other dimension (2-D mesh data x model). The MLP keeps
          its TP-only layout (``ParallelMLP`` places it).
========  ================================================================================

Block variable paths and shapes (``block_<i>/`` prefix; C channels, H heads, K KV heads,
D head_dim, F MLP hidden):

==============================================  ==========  =========  ===============  ==============
path                                            shape       fsdp       tp / tp+sp       fsdp+tp
==============================================  ==========  =========  ===============  ==============
attention/query/kernel                          (C, H, D)   (data,-,-) (-, model, -)    (data,model,-)
attention/key/kernel, attention/value/kernel    (C, K, D)   (data,-,-) (-, model, -)    (data,model,-)
attention/output/kernel                         (H, D, C)   (-,-,data) (model, -, -)    (model,-,data)
mlp/gate/kernel, mlp/up/kernel                  (C, F)      (data, -)  (-, model) [1]   (-, model) [1]
mlp/down/kernel                                 (F, C)      (-, data)  (model, -) [1]   (model, -) [1]
attention_norm/*, mlp_norm/*                    (C,)        replicated replicated       replicated
==============================================  ==========  =========  ===============  ==============

[1] placed by ``ParallelMLP`` itself when the mesh's model axis has size > 1.
"""

import keras

from zoo.distribution.axes import DATA, MODEL
from zoo.distribution.layouts import LayoutError
from zoo.distribution.mesh import describe_mesh, mesh_axis_size, require_axes

LAYOUT_STRATEGIES = ("data", "fsdp", "tp", "tp+sp", "fsdp+tp")


def check_strategy(strategy):
    if strategy not in LAYOUT_STRATEGIES:
        raise ValueError(f"unknown layout strategy {strategy!r}; choose one of {list(LAYOUT_STRATEGIES)}")


def uses_model_axis(strategy):
    return strategy in ("tp", "tp+sp", "fsdp+tp")


def uses_data_axis_for_weights(strategy):
    return strategy in ("fsdp", "fsdp+tp")


def config_overrides(strategy):
    """Model-config entries a strategy needs (``tp+sp`` builds the blocks sequence-parallel)."""
    check_strategy(strategy)
    return {"tp_sequence_parallel": strategy == "tp+sp"}


def block_rules(strategy, *, data_axis=DATA, model_axis=MODEL):
    """{regex: layout axes} for every ``TransformerBlock`` weight the strategy splits."""
    check_strategy(strategy)
    d = data_axis if uses_data_axis_for_weights(strategy) else None
    m = model_axis if uses_model_axis(strategy) else None
    if d is None and m is None:
        return {}
    rules = {
        r".*attention/(query|key|value)/kernel": (d, m, None),  # (C, H|K, D)
        r".*attention/output/kernel": (m, None, d),  # (H, D, C)
    }
    if m is None:  # ParallelMLP places its weights only when the model axis splits them
        rules[r".*mlp/(gate|up)/kernel"] = (d, None)  # (C, F)
        rules[r".*mlp/down/kernel"] = (None, d)  # (F, C)
    return rules


def build_layout_map(mesh, strategy, rules, *, data_axis=DATA, model_axis=MODEL):
    """A ``LayoutMap`` on ``mesh`` holding ``rules``, after checking the mesh has the
    axes the strategy uses. Rules whose axes are all None are left out."""
    check_strategy(strategy)
    needed = ([data_axis] if uses_data_axis_for_weights(strategy) else []) + (
        [model_axis] if uses_model_axis(strategy) else []
    )
    require_axes(mesh, needed, f"layout strategy {strategy!r}")
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in rules.items():
        if any(axis is not None for axis in axes):
            layout_map[pattern] = axes
    return layout_map


def check_divisible(mesh, strategy, sizes, *, data_axis=DATA, model_axis=MODEL):
    """Raise ``LayoutError`` naming the numbers unless every size splits evenly.

    ``sizes``: {"num_heads": 8, ...} for the model axis, or {("hidden_dim", "data"): 256}
    for another axis. Only axes the strategy uses are checked.
    """
    for key, size in sizes.items():
        name, axis = key if isinstance(key, tuple) else (key, model_axis)
        if axis == model_axis and not uses_model_axis(strategy):
            continue
        if axis == data_axis and not uses_data_axis_for_weights(strategy):
            continue
        split = mesh_axis_size(mesh, axis) if axis in mesh.axis_names else 1
        if size % split:
            raise LayoutError(
                f"layout strategy {strategy!r}: {name}={size} is not divisible by the {axis!r} mesh "
                f"axis of size {split} (mesh {describe_mesh(mesh)}); choose a mesh whose {axis!r} "
                f"axis divides {size}"
            )
