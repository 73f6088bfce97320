"""``ContextParallel``: a Keras distribution that splits token inputs on batch *and* sequence.

Keras' ``DataParallel`` and ``ModelParallel`` split every input on its first dimension
only. ``ContextParallel`` also splits dimension 1, the sequence, over a ``seq`` mesh
axis, so ``model.fit`` / ``evaluate`` / ``predict`` hand every device a
[B/Nd, T/Ns, ...] block of each batch (Keras places each batch with
``get_data_layout(shape)``). The zoo's attention layers see the distribution and run
their ``shard_map`` kernel (``context_attention``: ring, all-gather K/V or Ulysses)
over the ``seq`` axis (a layer built with ``context_attention=None`` records the
distribution's kernel in its config);
everything per-token (embeddings, norms, MLPs, the head, a per-token loss) stays GSPMD
on sequence-split arrays.

Weights: FSDP over the sequence axis by default (``shard_weights=True``). Every weight
of rank >= 2 (kernels, embeddings; not norms or biases) is split over ``seq`` on its
first dimension that is not split already and divides by the axis size, on top of
what the layout map says (none: replicated), e.g. a (C, F) kernel (seq, -), a TP
rule's (-, model) kernel (seq, model). GSPMD all-gathers each where it is used, and
the gradients and optimizer slots are split the same way, so the Ns devices that
share the batch shard no longer each hold every weight. The zoo's tensor-parallel
layers, which place their own weights, split them over ``seq`` too (the
``weight_shard_axis`` they read) and gather them inside their ``shard_map``.
``shard_weights=False`` keeps every weight as the layout map places it.

Causal load balancing (``balance="zigzag"`` or ``"striped"``) is a reordering of the
sequence that happens in the input pipeline, before Keras shards the batch:
``prepare(x, y)`` (arrays), ``dataset(source)`` (a ``PyDataset`` or an iterable of
batches) put every array of rank >= 2 into the balanced order along dim 1, and
``restore_outputs(y_pred)`` puts ``predict``'s outputs back. A loss that is a mean over
tokens is invariant to the permutation, so training on reordered batches gives the
natural-order numbers (the attention layers read each token's global position from
the order).

Shapes: B batch, T sequence length, Nd size of the batch axis, Ns of the sequence axis.
"""

import jax
import keras
import numpy as np

from zoo import kernels
from zoo._compat import variable_layout
from zoo.config.choices import BALANCES, CONTEXT_ATTENTIONS, DEFAULT_CONTEXT_ATTENTION
from zoo.distribution.axes import DATA, SEQ
from zoo.distribution.layouts import CheckedModelParallel, LayoutError, stacking_dimensions
from zoo.distribution.mesh import MeshError, describe_mesh, make_mesh, mesh_axis_size


class ContextParallel(CheckedModelParallel):
    """Splits inputs over ``batch_dim_name`` (dim 0) and ``sequence_dim_name`` (dim 1).

    Args:
        device_mesh: a ``keras.distribution.DeviceMesh`` or a spec such as
            ``"data=2,seq=4"``; it must have both axes (size 1 is allowed). May be
            omitted when ``layout_map`` is given (its mesh is used).
        layout_map: a ``keras.distribution.LayoutMap`` on the same mesh for the
            weights (e.g. TP rules over a ``model`` axis); None: no rules (weights replicated
            but for the FSDP split of ``shard_weights``).
        batch_dim_name: the mesh axis the batch is split over.
        sequence_dim_name: the mesh axis the sequence is split over.
        context_attention: the kernel every zoo attention layer whose own
            ``context_attention`` is None runs (and records in its config): ``"ring"``,
            ``"gather"`` or ``"ulysses"``.
        balance: None, ``"zigzag"`` or ``"striped"``: the order ``prepare`` /
            ``dataset`` put the sequence in, which the attention layers follow.
        shard_weights: split every weight of rank >= 2 over the sequence axis as
            well (FSDP over ``seq``; the default); False keeps the layout map's
            layouts (replicated without a rule).
        auto_shard_dataset: as in ``keras.distribution.ModelParallel``.

    Data layouts: rank >= 2 -> (batch, seq, None, ...); rank 1 -> (batch,). Every
    rank >= 2 input is taken to have its sequence in dim 1 (use sparse, not one-hot,
    labels for per-sequence targets).
    """

    def __init__(
        self,
        device_mesh=None,
        layout_map=None,
        *,
        batch_dim_name=DATA,
        sequence_dim_name=SEQ,
        context_attention=DEFAULT_CONTEXT_ATTENTION,
        balance=None,
        shard_weights=True,
        auto_shard_dataset=True,
    ):
        _check_options(context_attention, balance, batch_dim_name, sequence_dim_name)
        layout_map = _layout_map_on(device_mesh, layout_map)
        _require_axes(layout_map.device_mesh, batch_dim_name, sequence_dim_name)
        super().__init__(layout_map=layout_map, batch_dim_name=batch_dim_name, auto_shard_dataset=auto_shard_dataset)
        self._sequence_dim_name = sequence_dim_name
        self._context_attention = context_attention
        self._balance = balance
        self._shard_weights = bool(shard_weights)

    @property
    def sequence_dim_name(self):
        return self._sequence_dim_name

    @property
    def context_attention(self):
        """The sequence-parallel attention kernel: ``"ring"``, ``"gather"`` or ``"ulysses"``."""
        return self._context_attention

    @property
    def balance(self):
        return self._balance

    @property
    def shard_weights(self):
        """Whether weights are also split over the sequence axis (FSDP over ``seq``)."""
        return self._shard_weights

    @property
    def weight_shard_axis(self):
        """The axis the zoo's tensor-parallel layers also split their weights over."""
        return self._sequence_dim_name if self._shard_weights else None

    @property
    def sequence_parallel_size(self):
        """Ns, how many ways the sequence is split."""
        return mesh_axis_size(self.device_mesh, self._sequence_dim_name)

    def __repr__(self):
        return (
            f"ContextParallel(mesh={describe_mesh(self.device_mesh)}, batch_dim_name={self.batch_dim_name!r}, "
            f"sequence_dim_name={self._sequence_dim_name!r}, context_attention={self._context_attention!r}, balance={self._balance!r}, "
            f"shard_weights={self._shard_weights!r})"
        )

    # --- where Keras puts each weight ------------------------------------------------------

    def get_variable_layout(self, variable):
        """The layout map's layout (checked, see ``CheckedModelParallel``), with the first
        free dimension that divides also split over the sequence axis when
        ``shard_weights`` (rank >= 2 only). A layout the variable was created with (the
        zoo's tensor-parallel layers) is kept as it is: those layers place ``seq`` themselves."""
        layout = super().get_variable_layout(variable)
        if not self._shard_weights or variable_layout(variable) is not None or len(variable.shape) < 2:
            return layout
        stacked = stacking_dimensions(self._layout_map, variable.path)  # a scanned stack's (R, L/R): not split
        return self._split_over_sequence(variable.shape, layout, first=stacked)

    def _split_over_sequence(self, shape, layout, first=0):
        size, axis = self.sequence_parallel_size, self._sequence_dim_name
        axes = list(layout.axes)
        if size == 1 or any(axis == a or (isinstance(a, (tuple, list)) and axis in a) for a in axes):
            return layout
        for dim, (length, current) in enumerate(zip(shape, axes)):
            if dim >= first and current is None and length % size == 0:
                axes[dim] = axis
                return keras.distribution.TensorLayout(axes, self.device_mesh)
        return layout  # no dimension divides: replicated over the sequence axis

    # --- where Keras puts each input batch ---------------------------------------------

    def get_data_layout(self, data_shape):
        """(batch, seq, None, ...) for rank >= 2, (batch,) for rank 1; checks the sizes."""
        self.check_data_shape(data_shape)
        spec = [None] * len(data_shape)
        if spec:
            spec[0] = self.batch_dim_name  # (B/Nd, ...)
        if len(spec) >= 2:
            spec[1] = self._sequence_dim_name  # (B/Nd, T/Ns, ...)
        return keras.distribution.TensorLayout(spec, self.device_mesh)

    def check_data_shape(self, data_shape):
        """Raise, naming the numbers, unless the batch and the sequence split evenly."""
        batch_size = mesh_axis_size(self.device_mesh, self.batch_dim_name)
        # Keras hands this process's share of the batch; only one process sees it whole.
        if data_shape and data_shape[0] is not None and jax.process_count() == 1 and data_shape[0] % batch_size:
            raise ValueError(
                f"batch size {data_shape[0]} is not divisible by the {self.batch_dim_name!r} mesh axis of "
                f"size {batch_size} (ContextParallel splits dim 0 of input shape {tuple(data_shape)} over it)"
            )
        if len(data_shape) >= 2 and data_shape[1] is not None:
            kernels.check_sequence_divisible(
                data_shape[1],
                axis_size=self.sequence_parallel_size,
                axis_name=self._sequence_dim_name,
                balance=self._balance,
                what=f"sequence length (dim 1 of input shape {tuple(data_shape)})",
            )

    # --- the input pipeline: load-balanced order -----------------------------------------

    def permutation(self, seq_len):
        """i32[T]: ``balanced[:, j] = natural[:, permutation[j]]`` (``arange`` without balance)."""
        if self._balance is None:
            return np.arange(seq_len, dtype=np.int32)
        return kernels.permutation(seq_len, num_shards=self.sequence_parallel_size, balance=self._balance)

    def reorder(self, data):
        """Every array of rank >= 2 in ``data`` (any nest) put in the balanced order along dim 1."""
        return self._map_sequences(data, kernels.reorder)

    def restore(self, data):
        """Inverse of ``reorder``: every array of rank >= 2 back in the natural order."""
        return self._map_sequences(data, kernels.restore)

    def prepare(self, x, y=None, sample_weight=None):
        """``reorder`` applied to what is given: ``x``, ``(x, y)`` or ``(x, y, sample_weight)``.

        ``model.fit(*cp.prepare(x, y), ...)``; ``model.predict(cp.prepare(x))``.
        """
        if sample_weight is not None:
            return self.reorder((x, y, sample_weight))
        return self.reorder(x) if y is None else self.reorder((x, y))

    def restore_outputs(self, y_pred):
        """``predict``'s outputs (any nest) back in the natural order (same as ``restore``)."""
        return self.restore(y_pred)

    def dataset(self, source):
        """``source``'s batches in the balanced order.

        A ``keras.utils.PyDataset`` gives a ``PyDataset`` (epochs, length and workers as
        the source's); any other iterable of batches (a generator, a list of
        ``(x, y)`` tuples) gives a generator. Without ``balance`` ``source`` is returned.
        """
        if self._balance is None:
            return source
        if isinstance(source, keras.utils.PyDataset):
            return ReorderedPyDataset(source, self.reorder)
        if hasattr(source, "as_numpy_iterator"):  # tf.data.Dataset
            source = source.as_numpy_iterator()
        try:
            batches = iter(source)
        except TypeError:
            raise TypeError(
                f"ContextParallel.dataset takes a keras.utils.PyDataset or an iterable of batches, got {type(source).__name__}"
            ) from None
        return (self.reorder(batch) for batch in batches)

    def _map_sequences(self, data, function):
        if self._balance is None or self.sequence_parallel_size == 1:
            return data
        options = dict(num_shards=self.sequence_parallel_size, axis=1, balance=self._balance)

        def apply(array):
            if getattr(array, "ndim", 0) < 2:
                return array
            return function(array if isinstance(array, jax.Array) else np.asarray(array), **options)

        return keras.tree.map_structure(apply, data)


class ReorderedPyDataset(keras.utils.PyDataset):
    """A ``PyDataset`` whose batches are ``source``'s passed through ``reorder``."""

    def __init__(self, source, reorder):
        super().__init__(
            workers=source.workers, use_multiprocessing=source.use_multiprocessing, max_queue_size=source.max_queue_size
        )
        self.source = source
        self._reorder = reorder

    def __getitem__(self, index):
        return self._reorder(self.source[index])

    @property
    def num_batches(self):
        return self.source.num_batches  # None: infinite

    def on_epoch_begin(self):
        self.source.on_epoch_begin()

    def on_epoch_end(self):
        self.source.on_epoch_end()


def _check_options(context_attention, balance, batch_dim_name, sequence_dim_name):
    if context_attention not in CONTEXT_ATTENTIONS:
        raise ValueError(f"context_attention must be one of {CONTEXT_ATTENTIONS}, got {context_attention!r}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
    if batch_dim_name == sequence_dim_name:
        raise ValueError(
            f"batch_dim_name and sequence_dim_name must be different mesh axes, both are {batch_dim_name!r}"
        )


def _layout_map_on(device_mesh, layout_map):
    """``layout_map`` (checked to be on ``device_mesh``), or an empty one on ``device_mesh``."""
    if device_mesh is None and layout_map is None:
        raise ValueError("ContextParallel needs a device_mesh (e.g. 'data=2,seq=4') or a layout_map")
    if layout_map is None:
        mesh = make_mesh(device_mesh) if isinstance(device_mesh, str) else device_mesh
        return keras.distribution.LayoutMap(mesh)
    if device_mesh is not None:
        mesh = make_mesh(device_mesh) if isinstance(device_mesh, str) else device_mesh
        if not _same_mesh(mesh, layout_map.device_mesh):
            raise LayoutError(
                f"the layout map was built for mesh {describe_mesh(layout_map.device_mesh)}, "
                f"not for the mesh {describe_mesh(mesh)} given"
            )
    return layout_map


def _same_mesh(a, b):
    if a is b:
        return True
    ids = lambda mesh: [d.id for d in np.asarray(mesh.devices).flat]  # noqa: E731
    return list(a.axis_names) == list(b.axis_names) and tuple(a.shape) == tuple(b.shape) and ids(a) == ids(b)


def _require_axes(mesh, batch_dim_name, sequence_dim_name):
    missing = [axis for axis in (batch_dim_name, sequence_dim_name) if axis not in mesh.axis_names]
    if missing:
        raise MeshError(
            f"ContextParallel splits the batch over mesh axis {batch_dim_name!r} and the sequence over "
            f"{sequence_dim_name!r}, but the mesh {describe_mesh(mesh)} has axes {list(mesh.axis_names)} "
            f"(missing {missing}); add them to the mesh spec, e.g. '{batch_dim_name}=2,{sequence_dim_name}=4' "
            f"(an axis of size 1 is allowed)"
        )
