"""Turn (model, mesh, strategy) into a ``keras.distribution.Distribution``.

=========  ==========================  ==================================================
strategy   mesh axes                   what is split
=========  ==========================  ==================================================
single     (none)                      nothing: one device, no distribution
data       ``data``                    the batch; every weight replicated
model      ``data`` and ``model``      the batch over ``data``; weights by the model's own
                                       layout map over ``model``
=========  ==========================  ==================================================
"""

import keras
import numpy as np

from zoo.distribution.axes import DATA, MODEL
from zoo.distribution.layouts import CheckedModelParallel, LayoutError, raise_if_unmatched
from zoo.distribution.mesh import MeshError, describe_mesh, make_mesh, mesh_axis_size, require_axes

STRATEGIES = ("single", "data", "model")
MODEL_PARALLEL_AXES = (DATA, MODEL)

# Mesh each strategy uses when the user names none (resolved against the device count).
DEFAULT_MESH_SPECS = {"data": "data=-1", "model": "data=2,model=-1"}


def default_mesh_spec(strategy, device_count):
    """The mesh spec a strategy uses by default on ``device_count`` devices."""
    _check_strategy(strategy)
    if strategy == "model" and device_count % 2:
        return "data=1,model=-1"
    return DEFAULT_MESH_SPECS.get(strategy)


def make_distribution(strategy, mesh=None, layout_map=None):
    """The distribution for ``strategy`` on ``mesh`` (None for ``"single"``).

    Args:
        strategy: one of ``STRATEGIES``.
        mesh: a ``keras.distribution.DeviceMesh`` or a spec string such as
            ``"data=2,model=4"``; defaults to ``default_mesh_spec(strategy, ...)``.
        layout_map: a ``keras.distribution.LayoutMap`` (required for ``"model"``),
            usually from the model class's ``get_layout_map(mesh)``.
    """
    _check_strategy(strategy)
    if strategy == "single":
        return None
    mesh = _as_mesh(strategy, mesh)
    if strategy == "data":
        return _data_parallel(mesh)
    return _model_parallel(mesh, layout_map)


def distribution_for(model_class, strategy, mesh=None, **layout_kwargs):
    """``make_distribution`` with the layout map that ``model_class`` ships."""
    _check_strategy(strategy)
    if strategy != "model":
        return make_distribution(strategy, mesh)
    mesh = _as_mesh(strategy, mesh)
    require_axes(mesh, MODEL_PARALLEL_AXES, "strategy 'model'")
    return _model_parallel(mesh, model_class.get_layout_map(mesh, **layout_kwargs))


def _check_strategy(strategy):
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {list(STRATEGIES)}")


def _as_mesh(strategy, mesh):
    if mesh is None:
        import jax

        mesh = default_mesh_spec(strategy, len(jax.devices()))
    return make_mesh(mesh) if isinstance(mesh, str) else mesh


def _data_parallel(mesh):
    require_axes(mesh, [DATA], "strategy 'data'")
    if len(mesh.axis_names) != 1:
        raise MeshError(
            f"strategy 'data' replicates every weight and needs a 1-D mesh with axis "
            f"{DATA!r}, got {describe_mesh(mesh)}; use strategy 'model' for a 2-D mesh"
        )
    return keras.distribution.DataParallel(device_mesh=mesh)


def _model_parallel(mesh, layout_map):
    require_axes(mesh, MODEL_PARALLEL_AXES, "strategy 'model'")
    if layout_map is None:
        raise LayoutError("strategy 'model' needs a layout_map (e.g. from the model's get_layout_map(mesh))")
    if layout_map.device_mesh is not mesh:
        raise LayoutError(
            f"the layout map was built for mesh {describe_mesh(layout_map.device_mesh)}, "
            f"not for the mesh {describe_mesh(mesh)} given"
        )
    return CheckedModelParallel(layout_map=layout_map, batch_dim_name=DATA)


def data_parallel_size(distribution):
    """How many ways the batch is split (1 without a distribution).

    Every batch fed to ``fit``/``evaluate``/``predict`` must divide by this.
    """
    if distribution is None:
        return 1
    return mesh_axis_size(distribution.device_mesh, distribution.batch_dim_name)


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
