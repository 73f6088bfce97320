"""Layouts shared by the Transformer models (GPT, encoder classifier, ViT).

Each model's ``get_layout_map(mesh, layout=..., config=None)`` is built here from the
rules every ``zoo.layers.TransformerBlock`` needs plus the model's own rules (its
embeddings and head). Layouts:

========  ================================================================================
data      no rules: every weight replicated (use with ``DataParallel``)
fsdp      every large weight split over the data axis (ZeRO-3 / FSDP); GSPMD all-gathers
          each weight where it is used. The optimizer's slots copy their variable's
          layout, so optimizer state is split the same way.
tp        Megatron tensor parallelism over the model axis. The block's layers place
          their own weights (no block rule appears here): ``MultiHeadAttention`` splits
          the heads (query/key/value column-parallel, output row-parallel, one
          ``shard_map``), ``ParallelMLP`` the hidden features (column up/gate, row down).
tp+sp     as ``tp``, and the model is built with ``megatron_sp=True``: the
          residual stream, norms and dropout run split on the sequence over the model
          axis (Megatron sequence parallelism). Same weight layouts as ``tp``.
fsdp+tp   ``tp`` on the model axis, and every large weight also split over the data
          axis on its other dimension (2-D mesh data x model). The map is marked
          (``mark_weight_shard_axis``) so the distribution tells the block's layers to
          split their weights over data too and all-gather them just in time.
========  ================================================================================

Block variable paths and shapes (``block_<i>/`` prefix; C channels, H heads, K KV heads,
D head_dim, F MLP hidden):

==============================================  ==========  =========  ===============  ==============
path                                            shape       fsdp       tp / tp+sp [1]   fsdp+tp [1]
==============================================  ==========  =========  ===============  ==============
attention/query/kernel                          (C, H, D)   (data,-,-) (-, model, -)    (data,model,-)
attention/key/kernel, attention/value/kernel    (C, K, D)   (data,-,-) (-, model, -)[2] (data,model,-)[2]
attention/output/kernel                         (H, D, C)   (-,-,data) (model, -, -)    (model,-,data)
mlp/gate/kernel, mlp/up/kernel                  (C, F)      (data, -)  (-, model)       (data, model)
mlp/down/kernel                                 (F, C)      (-, data)  (model, -)       (model, data)
attention_norm/*, mlp_norm/*                    (C,)        replicated replicated       replicated
attention/{query,key}_norm/scale (qk_norm)      (D,)        replicated replicated       replicated
==============================================  ==========  =========  ===============  ==============

[1] placed by the layers themselves (``MultiHeadAttention``, ``ParallelMLP``) when the
mesh's model axis has size > 1, at creation, so no layout rule can place them otherwise.
On a model axis of size 1 the layers are plain and the ``fsdp`` rules apply instead
(``fsdp+tp``) or nothing is split (``tp``).
[2] with fewer KV heads than the model axis (K < N, N % K == 0) the key and value
kernels are replicated over ``model`` (Megatron's rule): each device computes the one
KV head its query heads use.
"""

import keras

from zoo.config.choices import WEIGHT_LAYOUTS
from zoo.config.layouts import LAYOUT_TABLE, layout_record
from zoo.distribution.axes import DATA, MODEL
from zoo.distribution.layouts import LayoutError, mark_weight_shard_axis
from zoo.distribution.mesh import describe_mesh, mesh_axis_size, require_axes


def check_layout(layout):
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {list(WEIGHT_LAYOUTS)}")


def uses_model_axis(layout):
    """The layout's blocks split over the model axis (Megatron)."""
    return layout_record(layout).model_axis is not None


def uses_data_axis_for_weights(layout):
    """The layout splits the weights over the data axis (FSDP)."""
    return layout_record(layout).fsdp_axis == DATA


def splits_sequence_over_model(layout):
    """Megatron sequence parallelism (tp+sp): outside attention the blocks split the tokens
    over the model axis, so the model must be built with ``megatron_sp=True``."""
    record = LAYOUT_TABLE.get(layout)
    return record is not None and record.sequence_over_model


def layout_overrides(layout):
    """Model-config entries ``layout`` needs: ``{"megatron_sp": True}`` for tp+sp
    (the blocks run Megatron sequence-parallel), ``{"schedule": "gpipe"}`` for
    pipeline (a GPT whose blocks are one ``PipelinedBlocks``; a schedule already
    in the config is kept, see ``named_config``), ``{}`` for any other layout name."""
    return dict(layout_record(layout).model_options) if layout in LAYOUT_TABLE else {}


def layers_place_weights(layout, mesh=None, *, model_axis=MODEL):
    """True when the block's tensor-parallel layers place their own weights: the layout
    splits over the model axis and the mesh's model axis (assumed if ``mesh`` is None)
    has size > 1."""
    if not uses_model_axis(layout):
        return False
    return mesh is None or (model_axis in mesh.axis_names and mesh_axis_size(mesh, model_axis) > 1)


def block_rules(layout, *, mesh=None, data_axis=DATA, model_axis=MODEL):
    """{regex: layout axes} for every ``TransformerBlock`` weight the layout splits
    that the block's layers do not place themselves (see ``layers_place_weights``)."""
    check_layout(layout)
    if layers_place_weights(layout, mesh, model_axis=model_axis):
        return {}
    if not uses_data_axis_for_weights(layout):
        return {}
    return block_matrix_rules(data_axis=data_axis)


def block_matrix_rules(*, prefix=".*", lead=(), data_axis=None, model_axis=None, kv_axis=None):
    """{regex: axes} of a block's matrices, the one statement of how a layout splits them:
    behind ``lead`` (a stacked block's stacking dimensions; none for a layer), each matrix's
    C over ``data_axis`` (FSDP), the query heads, the output's heads and the MLP's hidden
    features over ``model_axis`` (Megatron), the key/value heads over ``kv_axis``."""
    d, m = data_axis, model_axis
    return {
        rf"{prefix}attention/query/kernel": (*lead, d, m, None),  # (..., C, H, D)
        rf"{prefix}attention/(key|value)/kernel": (*lead, d, kv_axis, None),  # (..., C, K, D)
        rf"{prefix}attention/output/kernel": (*lead, m, None, d),  # (..., H, D, C)
        rf"{prefix}mlp/(gate|up)/kernel": (*lead, d, m),  # (..., C, F)
        rf"{prefix}mlp/down/kernel": (*lead, m, d),  # (..., F, C)
    }


def build_layout_map(mesh, layout, rules, *, data_axis=DATA, model_axis=MODEL):
    """A ``LayoutMap`` on ``mesh`` holding ``rules``, after checking the mesh has the
    axes the layout uses. Rules whose axes are all None are left out."""
    check_layout(layout)
    needed = ([data_axis] if uses_data_axis_for_weights(layout) else []) + (
        [model_axis] if uses_model_axis(layout) else []
    )
    require_axes(mesh, needed, f"layout {layout!r}")
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in rules.items():
        if any(axis is not None for axis in axes):
            layout_map[pattern] = axes
    if uses_model_axis(layout) and uses_data_axis_for_weights(
        layout
    ):  # the TP layers split their weights over data too
        mark_weight_shard_axis(layout_map, data_axis)
    return layout_map


def check_divisible(mesh, layout, sizes, *, data_axis=DATA, model_axis=MODEL):
    """Raise ``LayoutError`` naming the numbers unless every size splits evenly.

    ``sizes``: {"num_query_heads": 8, ...} for the model axis, or {("hidden_dim", "data"): 256}
    for another axis. Only axes the layout uses are checked.
    """
    for key, size in sizes.items():
        name, axis = key if isinstance(key, tuple) else (key, model_axis)
        if axis == model_axis and not uses_model_axis(layout):
            continue
        if axis == data_axis and not uses_data_axis_for_weights(layout):
            continue
        split = mesh_axis_size(mesh, axis) if axis in mesh.axis_names else 1
        if size % split:
            raise LayoutError(
                f"layout {layout!r}: {name}={size} is not divisible by the {axis!r} mesh "
                f"axis of size {split} (mesh {describe_mesh(mesh)}); choose a mesh whose {axis!r} "
                f"axis divides {size}"
            )


def check_kv_heads(mesh, layout, num_key_value_heads, *, model_axis=MODEL):
    """Raise ``LayoutError`` unless the KV heads split over the model axis or the model
    axis splits them: K % N == 0 (each device holds K/N KV heads) or N % K == 0 (fewer KV
    heads than devices: replicated, Megatron's rule; each device uses one)."""
    if not uses_model_axis(layout) or model_axis not in mesh.axis_names:
        return
    split = mesh_axis_size(mesh, model_axis)
    if num_key_value_heads % split and split % num_key_value_heads:
        raise LayoutError(
            f"layout {layout!r}: num_key_value_heads={num_key_value_heads} and the {model_axis!r} mesh axis of size "
            f"{split} (mesh {describe_mesh(mesh)}) do not divide each other; tensor parallelism splits the KV heads "
            f"over the axis when it divides them, or replicates them when their number divides it"
        )
