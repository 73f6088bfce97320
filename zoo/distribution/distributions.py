"""Turn (model, layout, mesh) into a ``keras.distribution.Distribution``.

=========  ==========================  ==================================================
layout     mesh axes                   what is split
=========  ==========================  ==================================================
single     (none)                      nothing: one device, no distribution
data       ``data``                    the batch; every weight replicated
model      ``data`` and ``model``      the batch over ``data``; weights by the model's own
                                       layout map over ``model``
fsdp       ``data``                    the batch, and every large weight over ``data``
                                       (the Transformer models' ``layout="fsdp"`` rules)
tp         ``data`` and ``model``      the batch over ``data``; attention heads and MLP
                                       features over ``model`` (Megatron, ``"tp"`` rules)
tp+sp      ``data`` and ``model``      as ``tp``; build the model with
                                       ``megatron_sp=True`` (Megatron sequence
                                       parallelism; same weight layouts)
fsdp+tp    ``data`` and ``model``      ``tp``, plus attention and embedding weights split
                                       over ``data`` on their other dimension
pipeline   ``data`` and ``stage``      the batch over ``data``; the GPT's stacked blocks
           (optionally ``model``)      over ``stage`` (``PipelinedBlocks``, micro-batches
                                       passed stage to stage); with a ``model`` axis
                                       Megatron inside each stage. A mesh spec without
                                       ``data`` gets ``data=1``
context    ``data`` and ``seq``        the batch over ``data`` and the sequence over
           (optionally ``model``)      ``seq`` (``ContextParallel``); attention runs its
                                       ring / all-gather / Ulysses kernel
                                       (``context_attention``); weights FSDP over ``seq``
                                       (``shard_weights=False``: not); with a ``model``
                                       axis also the ``"tp"`` layouts
=========  ==========================  ==================================================

``distribution_for(model_class, layout, mesh)`` is the one entry from a model, a layout
and a mesh: ``fsdp``, ``tp``, ``tp+sp``, ``fsdp+tp`` (and ``context`` with a ``model``
axis) take the layout map from ``model_class.get_layout_map(mesh, layout=...)``: the
Transformer models (GPT, encoder, ViT) ship one. ``make_distribution(layout, mesh,
layout_map)`` is the same for a layout map you wrote yourself; ``context`` needs none:
``make_distribution("context", "data=2,seq=4")`` works for any model whose inputs are
(B, T, ...) token arrays.
"""

import contextlib
import inspect

import keras
import numpy as np

from zoo.config.choices import (
    BASIC_LAYOUTS,
    DEFAULT_CONTEXT_ATTENTION,
    LAYOUTS,
    TRANSFORMER_LAYOUTS,
)
from zoo.config.layouts import layout_record
from zoo.distribution.axes import DATA, MODEL, SEQ
from zoo.distribution.context_parallel import ContextParallel
from zoo.distribution.expert_parallel import ExpertParallel
from zoo.distribution.layouts import (
    CheckedModelParallel,
    LayoutError,
    raise_if_unmatched,
)
from zoo.distribution.mesh import (
    MeshError,
    describe_mesh,
    make_mesh,
    mesh_axis_size,
    require_axes,
)


def default_mesh_spec(layout, device_count):
    """The mesh spec a layout uses by default on ``device_count`` devices."""
    _check_layout(layout)
    spec = layout_record(layout).default_mesh
    if spec is not None and spec.startswith("data=2,") and device_count % 2:
        return spec.replace("data=2,", "data=1,")
    return spec


def default_mesh_candidates(layout, device_count):
    """Mesh specs for ``layout`` on ``device_count`` devices, the default first, then with
    its split axis (the one sized -1 there) smaller by each factor of it in turn and
    ``data`` that much larger: ``expert`` on 8 devices: data=1,expert=8, data=2,expert=4,
    data=4,expert=2, data=8,expert=1."""
    spec = default_mesh_spec(layout, device_count)
    if spec is None or "-1" not in spec:
        return [spec]
    sizes = dict(part.split("=") for part in spec.split(","))
    split_axis = next(axis for axis, size in sizes.items() if size == "-1")
    if split_axis == DATA:  # fsdp: every device on data, nothing else to fit
        return [spec]
    fixed = int(np.prod([int(size) for axis, size in sizes.items() if axis != split_axis]))
    split = device_count // fixed
    candidates = []
    for factor in (f for f in range(1, split + 1) if split % f == 0):
        values = {axis: int(size) for axis, size in sizes.items() if axis != split_axis}
        values[DATA] = values.get(DATA, 1) * factor
        values[split_axis] = split // factor
        candidates.append(",".join(f"{axis}={values[axis]}" for axis in sizes))
    return candidates


def _fitting_default_mesh(model_class, layout, config):
    """The first of ``default_mesh_candidates`` whose layout map ``config`` fits (its
    ``LayoutError`` otherwise: the default mesh's)."""
    import jax

    first_error = None
    for spec in default_mesh_candidates(layout, len(jax.devices())):
        mesh = _as_mesh(layout, spec)
        try:
            _require_layout_axes(mesh, layout)
            _layout_map_for(model_class, mesh, layout, {"config": config})
        except LayoutError as error:
            first_error = first_error or error
            continue
        return mesh
    raise first_error


def make_distribution(layout, mesh=None, layout_map=None, *, context_attention=None, balance=None, shard_weights=None):
    """The distribution for ``layout`` on ``mesh`` with a given layout map (None for ``"single"``).

    Args:
        layout: one of ``zoo.config.choices.LAYOUTS``.
        mesh: a ``keras.distribution.DeviceMesh`` or a spec string such as
            ``"data=2,model=4"``; defaults to ``default_mesh_spec(layout, ...)``.
        layout_map: a ``keras.distribution.LayoutMap`` (required for ``"model"``,
            fsdp, tp, tp+sp, fsdp+tp; optional for context), usually from
            the model class's ``get_layout_map(mesh, ...)``.
        context_attention, balance, shard_weights: ``"context"`` only: the attention
            kernel (default ``"ring"``), causal load balancing, and whether weights are
            also split over ``seq`` (default True; False keeps them as the layout map
            places them), see ``ContextParallel``.
    """
    _check_layout(layout)
    _check_context_options(layout, context_attention, balance, shard_weights)
    if layout == "single":
        return _single_device(mesh)
    mesh = _as_mesh(layout, mesh)
    if layout == "data":
        return _data_parallel(mesh)
    if layout == "context":
        return _context_parallel(mesh, layout_map, context_attention, balance, shard_weights)
    return _model_parallel(mesh, layout_map, layout)


def distribution_for(
    model_class, layout, mesh=None, *, context_attention=None, balance=None, shard_weights=None, config=None
):
    """The distribution for ``layout`` with the layout map that ``model_class`` ships
    (None for ``"single"``): the one entry from (model, layout, mesh).

    ``"model"`` calls ``model_class.get_layout_map(mesh)``; ``"fsdp"``, ``"tp"``,
    tp+sp, fsdp+tp call it with ``layout=`` that layout, and ``"context"``
    with ``layout="tp"`` when the mesh has a ``model`` axis, with ``layout="data"`` for a
    ``config`` with ``scan_layers`` (its stacked weights marked; without either every
    weight is replicated but for the FSDP split over ``seq``, and ``model_class`` is not
    consulted). ``config``: the model's config dict when known: the layout map checks
    its sizes against the mesh and fits it (no ``lm_head`` rule for tied embeddings);
    with no ``mesh``, the default mesh is the first of ``default_mesh_candidates`` that
    the model fits (``gpt_tiny_moe``'s 4 experts on 8 devices: ``data=2,expert=4``).
    ``context_attention``, ``balance``, ``shard_weights``: as in ``make_distribution``.
    """
    _check_layout(layout)
    _check_context_options(layout, context_attention, balance, shard_weights)
    if layout in ("single", "data"):
        return make_distribution(layout, mesh)
    if mesh is None and config is not None and layout not in ("model", "context"):
        mesh = _fitting_default_mesh(model_class, layout, config)
    mesh = _as_mesh(layout, mesh)
    _require_layout_axes(mesh, layout)
    fitted = {} if config is None else {"config": config}
    if layout == "model":  # the model's own map, fitted to its config where it takes one (tied: no head rule)
        takes_config = "config" in inspect.signature(model_class.get_layout_map).parameters
        return _model_parallel(mesh, model_class.get_layout_map(mesh, **(fitted if takes_config else {})), layout)
    if layout == "context":
        layout_map = _context_layout_map(model_class, mesh, fitted)
        return _context_parallel(mesh, layout_map, context_attention, balance, shard_weights)
    return _model_parallel(mesh, _layout_map_for(model_class, mesh, layout, fitted), layout)


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(
            f"unknown layout {layout!r}; choose one of {list(BASIC_LAYOUTS)} or, for the "
            f"Transformer models and token inputs, {list(TRANSFORMER_LAYOUTS)}"
        )


def _check_context_options(layout, context_attention, balance, shard_weights=None):
    if layout != "context" and (context_attention is not None or balance is not None or shard_weights is not None):
        raise ValueError(
            f"context_attention={context_attention!r}, balance={balance!r} and shard_weights={shard_weights!r} are "
            f"options of layout 'context' (they reorder or split the sequence), not of {layout!r}"
        )


def _single_device(mesh):
    if mesh:
        raise MeshError(
            f"layout 'single' runs on one device; drop the mesh {mesh if isinstance(mesh, str) else describe_mesh(mesh)!r}"
        )


def _as_mesh(layout, mesh):
    if mesh is None:
        import jax

        mesh = default_mesh_spec(layout, len(jax.devices()))
    record = layout_record(layout)
    if (record.stage_axis or record.expert_axis) and isinstance(mesh, str) and DATA not in _spec_axes(mesh):
        mesh = f"{DATA}=1,{mesh}"  # "stage=2,model=4", "expert=8": no data axis of its own
    return make_mesh(mesh) if isinstance(mesh, str) else mesh


def _spec_axes(spec):
    return [part.split("=")[0].strip() for part in spec.split(",") if part.strip()]


def _require_layout_axes(mesh, layout):
    require_axes(mesh, layout_record(layout).axes, f"layout {layout!r}")


def _layout_map_for(model_class, mesh, layout, fitted):
    """``model_class.get_layout_map(mesh, layout=layout, **fitted)``, or a clear error."""
    get_layout_map = getattr(model_class, "get_layout_map", None)
    name = getattr(model_class, "__name__", repr(model_class))
    if get_layout_map is None or "layout" not in inspect.signature(get_layout_map).parameters:
        raise ValueError(
            f"layout {layout!r} needs {name}.get_layout_map(mesh, layout=...), which {name} does not "
            f"have; it is for the Transformer models (GPT, encoder, ViT). Use layout 'data' or 'model'"
        )
    return get_layout_map(mesh, layout=layout, **fitted)


def _context_layout_map(model_class, mesh, fitted):
    """Layout ``context``'s weight rules: ``tp``'s on a mesh with a ``model`` axis; for a
    model built with stacked blocks (``scan_layers``), its ``data`` map (no rule: every
    weight whole), which marks their stacking dimensions (``mark_stacked_weights``); else
    None. ``ContextParallel`` adds the FSDP split over ``seq``."""
    if MODEL in mesh.axis_names:
        return _layout_map_for(model_class, mesh, "tp", fitted)
    if fitted.get("config", {}).get("scan_layers"):
        return _layout_map_for(model_class, mesh, "data", fitted)
    return None


def _data_parallel(mesh):
    require_axes(mesh, [DATA], "layout 'data'")
    if len(mesh.axis_names) != 1:
        raise MeshError(
            f"layout 'data' replicates every weight and needs a 1-D mesh with axis "
            f"{DATA!r}, got {describe_mesh(mesh)}; use layout 'model' for a 2-D mesh"
        )
    return keras.distribution.DataParallel(device_mesh=mesh)


def _context_parallel(mesh, layout_map, context_attention, balance, shard_weights=None):
    _require_layout_axes(mesh, "context")
    _check_layout_map_mesh(layout_map, mesh)
    return ContextParallel(
        mesh,
        layout_map,
        batch_dim_name=DATA,
        sequence_dim_name=SEQ,
        context_attention=context_attention or DEFAULT_CONTEXT_ATTENTION,
        balance=balance,
        shard_weights=True if shard_weights is None else shard_weights,
    )


def _model_parallel(mesh, layout_map, layout="model"):
    _require_layout_axes(mesh, layout)
    if layout_map is None:
        raise LayoutError(f"layout {layout!r} needs a layout_map (e.g. from the model's get_layout_map(mesh))")
    _check_layout_map_mesh(layout_map, mesh)
    record = layout_record(layout)
    if record.expert_axis:  # the batch over data x expert; fsdp+expert's map is marked for data
        return ExpertParallel(layout_map=layout_map, batch_dim_name=DATA, expert_dim_name=record.expert_axis)
    # fsdp+tp: the tensor-parallel layers also split their weights over data (FSDP inside TP)
    weight_shard_axis = record.fsdp_axis if record.model_axis else None
    return CheckedModelParallel(layout_map=layout_map, batch_dim_name=DATA, weight_shard_axis=weight_shard_axis)


def _check_layout_map_mesh(layout_map, mesh):
    if layout_map is not None and layout_map.device_mesh is not mesh:
        raise LayoutError(
            f"the layout map was built for mesh {describe_mesh(layout_map.device_mesh)}, "
            f"not for the mesh {describe_mesh(mesh)} given"
        )


def data_parallel_size(distribution):
    """How many ways the batch is split (1 without a distribution).

    Every batch fed to ``fit``/``evaluate``/``predict`` must divide by this.
    """
    if distribution is None:
        return 1
    if isinstance(distribution, ExpertParallel):  # the batch over data and expert
        return distribution.batch_split
    return mesh_axis_size(distribution.device_mesh, distribution.batch_dim_name)


@contextlib.contextmanager
def global_distribution(distribution):
    """``distribution`` (None: none) as Keras' global distribution inside the ``with``,
    the previous one restored on exit (``keras.distribution.set_distribution`` for a block)."""
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def build_distributed(build_model, distribution):
    """Set ``distribution`` globally, build the model under it, and check its layout.

    Keras places each variable as it is created, from the distribution in force, and
    ``model.fit`` reads the global distribution, so it stays set on return (pass
    ``None`` to build on one device). Raises ``LayoutError`` if a layout rule matched
    no variable of the model.
    """
    keras.distribution.set_distribution(distribution)
    model = build_model()
    if isinstance(distribution, CheckedModelParallel):
        raise_if_unmatched(distribution.unmatched_rules(), model)
    return model


def place_batch(distribution, *arrays):
    """Host arrays onto ``distribution``'s data layout (batch split), as ``fit`` places them.

    Without a distribution, or for a ``jax.Array`` already placed (a sequence-split input,
    say), the array is only converted. Returns a list in the order given.
    """
    import jax

    placed = []
    for array in arrays:
        if distribution is None or isinstance(array, jax.Array):
            placed.append(jax.numpy.asarray(array))
        else:
            layout = distribution.get_data_layout(array.shape)
            placed.append(keras.distribution.distribute_tensor(np.asarray(array), layout))
    return placed
