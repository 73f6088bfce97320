"""A recipe's budget (``RecipeBudget``), worked out without its devices: mesh, distribution, model and memory.

The mesh is a ``keras.distribution.DeviceMesh`` over placeholder devices whose
``backend_mesh`` is a ``jax.sharding.AbstractMesh`` (axis names and sizes only), so
the job's own distribution code and the model's layout map run unchanged for 32
devices on a laptop. The model is built by the job's own builder inside
``keras.StatelessScope(initialize_variables=False)``: Keras then creates every variable
with its path, shape and dtype but defers its initialisation, so nothing the size of
the model is allocated. Each variable's layout comes from the distribution exactly as
Keras asks for it at initialisation (a layout set at creation, e.g. by the zoo's
tensor-parallel layers, else ``distribution.get_variable_layout``), which also runs the
zoo's checks (rank, divisibility, rules that match nothing).
"""

import dataclasses
import math

import jax
import keras
import numpy as np

from zoo import distribution as zd
from zoo.config.layouts import layout_record
from zoo.distribution.mesh import resolve_mesh_shape
from zoo.measure.compiled_step import abstract_build, layout_under, slot_references
from zoo.units import GIB, format_bytes

TIGHT_MEMORY_FRACTION = 0.75  # state above this share of device memory leaves little for activations


class AbstractDeviceMesh(keras.distribution.DeviceMesh):
    """A ``DeviceMesh`` of ``shape`` over placeholder devices; nothing can be placed on it."""

    def __init__(self, axes):
        shape = tuple(size for _, size in axes)
        super().__init__(shape=shape, axis_names=[name for name, _ in axes], devices=np.arange(math.prod(shape)))

    @property
    def backend_mesh(self):
        return jax.sharding.AbstractMesh(tuple(self.shape), tuple(self.axis_names))


@dataclasses.dataclass(frozen=True)
class RecipeBudget:
    """What a recipe will run, per device, worked out analytically (``zoo recipe check``;
    ``zoo.planning.Plan`` is the compiled one): all memory figures are estimates in bytes."""

    path: str
    job: str
    description: str | None
    model: str
    layout: str
    mesh: str | None  # resolved, e.g. "data=8,model=4"; None for one device
    platform: str
    hosts: int
    devices: int
    parameters: int
    trainable_parameters: int
    weight_bytes: int  # per device: the model's variables under their layouts
    gradient_bytes: int  # per device: one gradient per trainable weight, same layout
    optimizer_bytes: int  # per device: optimizer slots, each laid out like its weight
    device_memory_bytes: int | None
    batch_size: int
    data_shards: int  # the batch is split this many ways
    sequence_length: int | None  # None: not a token model
    sequence_shards: int  # the sequence is split this many ways
    accumulation: int  # steps per optimizer update
    flops_per_step: float | None = None  # model FLOPs of one training step (zoo.measure.mfu); None: no formula
    peak_flops_per_device: float | None = None  # from [logging] peak_tflops
    notes: tuple = ()

    @property
    def state_bytes(self):
        return self.weight_bytes + self.gradient_bytes + self.optimizer_bytes

    @property
    def tokens_per_step(self):
        return None if self.sequence_length is None else self.batch_size * self.sequence_length

    def format(self):
        """The plan as text lines (``zoo recipe check`` prints them)."""
        lines = [f"recipe: {self.path} (job {self.job})" + (f": {self.description}" if self.description else "")]
        lines.append(
            f"target: {self.platform}, {self.hosts} host(s) x {self.devices // self.hosts} device(s) = {self.devices}"
        )
        trainable = (
            f" ({self.trainable_parameters:,} trainable)" if self.trainable_parameters != self.parameters else ""
        )
        lines.append(f"model: {self.model}, {self.parameters:,} parameters{trainable}")
        lines.append(f"layout: {self.layout}" + (f" on mesh {self.mesh}" if self.mesh else " (one device)"))
        per = self.batch_size // self.data_shards
        lines.append(
            f"batch: {self.batch_size} per step = {per} per data shard x {self.data_shards}; {self.accumulation} step(s) per update"
        )
        if self.sequence_length is not None:
            lines.append(
                f"tokens: {self.tokens_per_step:,} per step, {self.tokens_per_step * self.accumulation:,} per update; "
                f"sequence {self.sequence_length} = {self.sequence_length // self.sequence_shards} per shard x {self.sequence_shards}"
            )
        if self.flops_per_step:
            lines.append(self._flops_line())
        lines.append(self._memory_line())
        lines.extend(f"note: {note}" for note in self.notes)
        return lines

    def _flops_line(self):
        line = f"model FLOPs: {self.flops_per_step / 1e12:,.1f} TFLOP per step"
        if self.peak_flops_per_device:
            ideal = self.flops_per_step / (self.devices * self.peak_flops_per_device)
            line += f"; {1e3 * ideal:,.1f} ms per step at 100% MFU, {2e3 * ideal:,.1f} ms at 50%"
        return line

    def _memory_line(self):
        weights, gradients, optimizer = (
            format_bytes(count, 2) for count in (self.weight_bytes, self.gradient_bytes, self.optimizer_bytes)
        )
        parts = f"weights {weights}, gradients {gradients}, optimizer {optimizer}"
        total = f"= {format_bytes(self.state_bytes, 2)}"
        if self.device_memory_bytes:
            total += f" of {format_bytes(self.device_memory_bytes, 2)} ({100 * self.state_bytes / self.device_memory_bytes:.1f}%)"
        return f"memory per device (estimate, activations not included): {parts} {total}"


def resolve_axes(spec, layout, devices):
    """``[(axis, size)]`` of the mesh for ``layout`` on ``devices`` (``-1`` filled in);
    None for the single-device layout. Raises ``MeshError`` naming the numbers."""
    if layout == "single":
        if devices != 1:
            raise zd.MeshError(
                f"layout 'single' runs on one device but the target has {devices}; choose a parallel layout"
            )
        return None
    spec = spec or zd.default_mesh_spec(layout, devices)
    return resolve_mesh_shape(zd.parse_mesh_spec(spec), devices)


def describe_axes(axes):
    return None if axes is None else ",".join(f"{name}={size}" for name, size in axes)


def check_batch(distribution, axes, layout, batch_size, sequence_length, hosts):
    """``(data shards, sequence shards)``; raises ``ValueError`` naming the numbers unless
    the batch splits over the data axis and the processes, and the sequence over its axes."""
    sizes = dict(axes or [])
    data = zd.data_parallel_size(distribution)
    if batch_size % data:
        raise ValueError(
            f"[train] batch_size {batch_size} is not divisible by the {distribution.batch_dim_name!r} mesh axis of size {data}"
        )
    if batch_size % hosts:
        raise ValueError(
            f"[train] batch_size {batch_size} is not divisible by the {hosts} hosts (each process feeds an equal share)"
        )
    axis = layout_record(layout).sequence_axis  # context: seq; tp+sp: model
    split = {axis: sizes.get(axis, 1)} if axis else {}
    shards = math.prod(split.values())
    if sequence_length is not None and sequence_length % shards:
        named = " x ".join(f"{axis!r} ({size})" for axis, size in split.items() if size > 1)
        raise ValueError(
            f"[train] sequence_length {sequence_length} is not divisible by the mesh axes it is split over: {named} = {shards}"
        )
    if sequence_length is not None and hasattr(distribution, "check_data_shape"):
        distribution.check_data_shape((batch_size, sequence_length))  # e.g. causal load balancing needs 2 x seq
    return data, shards


def build_abstract(job, module, settings, distribution):
    """``(model, optimizer variables, {id(variable): layout axes})`` of the job's model,
    with no variable initialised (see the module docstring)."""
    model = abstract_build(
        lambda: job.build(module, settings), lambda m: job.compile(module, m, settings), distribution
    )
    axes = {id(v): _layout_axes(v, distribution) for v in model.variables}
    return model, list(model.optimizer.variables), axes


def _layout_axes(variable, distribution):
    """The layout axes Keras will give ``variable`` under ``distribution`` (() = replicated)."""
    layout = layout_under(variable, distribution)
    if isinstance(layout, jax.sharding.NamedSharding):  # a dimension split over several axes
        return tuple(layout.spec)
    return tuple(getattr(layout, "axes", None) or ())


def memory_per_device(model, optimizer_variables, axes, mesh_sizes):
    """``(weight, gradient, optimizer)`` bytes per device.

    Optimizer slots are created from their weight (``add_variable_from_reference``,
    named ``<weight path with _>_<slot>``) and take its layout; other optimizer
    variables (iteration count, learning rate) are replicated scalars.
    """

    def per_device(variable, layout_axes):
        split = math.prod(mesh_sizes[a] for axis in layout_axes for a in _names(axis))
        return math.prod(variable.shape) * jax.numpy.dtype(variable.dtype).itemsize // split

    weights = sum(per_device(v, axes[id(v)]) for v in model.variables)
    gradients = sum(per_device(v, axes[id(v)]) for v in model.trainable_variables)
    references = slot_references(optimizer_variables, model.trainable_variables)
    optimizer = sum(
        per_device(slot, axes[id(reference)] if reference is not None else ())
        for slot, reference in zip(optimizer_variables, references, strict=True)
    )
    return weights, gradients, optimizer


def _names(axis):
    if axis is None:
        return ()
    return tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)


def notes_for(axes, target, state_bytes):
    """Advice that is not an error: inner mesh axes crossing hosts, tight memory."""
    notes = []
    inner = math.prod(size for _, size in (axes or [])[1:])
    if target.hosts > 1 and inner > target.devices_per_host:
        notes.append(
            f"the mesh axes after the first ({describe_axes(axes[1:])}, {inner} devices) span more than one host "
            f"({target.devices_per_host} devices each): their collectives cross the host network"
        )
    memory = (target.device_memory_gib or 0) * GIB
    if memory and TIGHT_MEMORY_FRACTION * memory < state_bytes <= memory:
        notes.append(
            f"weights, gradients and optimizer state take {100 * state_bytes / memory:.0f}% of device memory; activations need the rest"
        )
    return notes


def check_memory(target, state_bytes, layout, mesh):
    """Raise ``ValueError`` if the training state alone cannot fit a device."""
    memory = (target.device_memory_gib or 0) * GIB
    if memory and state_bytes > memory:
        raise ValueError(
            f"weights, gradients and optimizer state need {format_bytes(state_bytes, 2)} per device under layout {layout!r} "
            f"on mesh {mesh} but [target] device_memory_gib is {target.device_memory_gib:g}: split the weights "
            f"more (fsdp over more devices, a larger model axis) or choose a smaller model"
        )
