"""``ExpertParallel``: a Keras distribution whose batch is split over ``data`` *and* ``expert``.

Expert parallelism (the ``expert`` layouts, docs/moe.md) holds 1/N_e of every
Mixture-of-Experts layer's experts per device of an ``expert`` mesh axis and sends
each token to the devices of its experts (``zoo.kernels.expert_parallel_moe``). For
the exchange to carry distinct tokens, the devices of the expert axis must hold
distinct tokens: the expert axis is also a data-parallel axis for everything that is
not an expert (embeddings, attention, norms, dense MLPs, the head), as in GShard,
DeepSpeed-MoE and MaxText. Keras' ``ModelParallel`` splits dim 0 of each input over
one axis only; ``ExpertParallel`` splits it over (``data``, ``expert``), so
``model.fit`` hands every device B / (N_d * N_e) rows.

Everything else is ``CheckedModelParallel``: weights by the layout map (the expert
weights (E, C, F) over ``expert`` on E), checked as they are created. Keras'
``batch_dim_name`` stays ``data`` (Keras' own bookkeeping reads one axis);
``batch_axes`` names both, and the zoo's layers split their ``shard_map``s' batch over
both (``zoo.layers._parallel_plan``). Shapes: B batch, N_d / N_e the axis sizes.
"""

import jax
import keras

from zoo.distribution.axes import DATA, EXPERT
from zoo.distribution.layouts import CheckedModelParallel
from zoo.distribution.mesh import describe_mesh, mesh_axis_size, require_axes


class SplitLayout(keras.distribution.TensorLayout):
    """A ``TensorLayout`` whose dimension may be split over several mesh axes
    (``(("data", "expert"), None)``), which Keras' own cannot name; its
    ``backend_layout`` is the ``jax.sharding.NamedSharding``."""

    def _validate_axes(self):
        names = set(self.device_mesh.axis_names) if self.device_mesh else None
        for axis in self.axes:
            for name in axis if isinstance(axis, tuple) else (axis,):
                if names is not None and name is not None and name not in names:
                    raise ValueError(f"mesh axis {name!r} of layout {self.axes} is not one of {sorted(names)}")

    @property
    def backend_layout(self):
        return jax.sharding.NamedSharding(self.device_mesh.backend_mesh, jax.sharding.PartitionSpec(*self.axes))


class ExpertParallel(CheckedModelParallel):
    """Splits inputs on dim 0 over ``batch_dim_name`` and ``expert_dim_name`` together.

    Args:
        layout_map: the model's ``LayoutMap`` (its mesh must have both axes; size 1 allowed).
        batch_dim_name: the data axis (``"data"``).
        expert_dim_name: the expert axis (``"expert"``).
        weight_shard_axis: as ``CheckedModelParallel`` (``fsdp+expert``: ``"data"``).

    Data layouts: dim 0 over (data, expert), every other dimension whole.
    """

    def __init__(self, *, layout_map, batch_dim_name=DATA, expert_dim_name=EXPERT, weight_shard_axis=None, **kwargs):
        require_axes(layout_map.device_mesh, [batch_dim_name, expert_dim_name], "ExpertParallel")
        super().__init__(
            layout_map=layout_map, batch_dim_name=batch_dim_name, weight_shard_axis=weight_shard_axis, **kwargs
        )
        self._expert_dim_name = expert_dim_name

    @property
    def expert_dim_name(self):
        return self._expert_dim_name

    @property
    def batch_axes(self):
        """The mesh axes dim 0 of every input is split over, major first, those of size > 1."""
        axes = (self.batch_dim_name, self._expert_dim_name)
        return tuple(axis for axis in axes if mesh_axis_size(self.device_mesh, axis) > 1)

    @property
    def batch_split(self):
        """How many ways the batch is split: N_d * N_e."""
        return mesh_axis_size(self.device_mesh, self.batch_dim_name) * mesh_axis_size(
            self.device_mesh, self._expert_dim_name
        )

    def get_data_layout(self, data_shape):
        """dim 0 over (data, expert); raises naming the numbers unless it divides."""
        if data_shape and data_shape[0] is not None and jax.process_count() == 1 and data_shape[0] % self.batch_split:
            raise ValueError(
                f"batch size {data_shape[0]} is not divisible by {self.batch_split}, the {self.batch_dim_name!r} x "
                f"{self._expert_dim_name!r} mesh axes of mesh {describe_mesh(self.device_mesh)} (ExpertParallel splits "
                f"dim 0 of input shape {tuple(data_shape)} over both)"
            )
        spec = [None] * len(data_shape)
        if spec:
            spec[0] = self.batch_axes or None
        return SplitLayout(spec, self.device_mesh)

    def __repr__(self):
        return (
            f"ExpertParallel(mesh={describe_mesh(self.device_mesh)}, batch_axes={self.batch_axes!r}, "
            f"weight_shard_axis={self.weight_shard_axis!r})"
        )
