"""Safetensors checkpoints (the Hugging Face format) read shard by shard, and written.

A checkpoint is one ``model.safetensors`` or several files listed by
``model.safetensors.index.json`` (``{"weight_map": {tensor name: file}}``). Reading uses
``safetensors.safe_open(..., framework="numpy")``, whose ``get_slice(name)[index]`` reads
only the bytes of that slice from the file. A model's weight is often the file's tensor
reshaped and transposed (Hugging Face keeps ``q_proj.weight`` as (H*D, C), the zoo its
query kernel as (C, H, D)): a ``TensorView`` says how, and turns each device's slice of
the zoo weight into the slice of the file's tensor that holds it. So
``load_into(variable, files, view)`` gives every device exactly its shard
(``jax.make_array_from_callback``), and no device, nor the host, ever holds a whole
split tensor. A Mixture-of-Experts weight (E, C, F) is E file tensors, one per expert
(Mixtral's ``experts.<j>.w1.weight``): a ``StackedView`` stacks them, and a device
holding experts j0..j1 (the ``expert`` layout) opens only those experts' tensors.

Why not ``keras.Model.load_weights``: it reads only Keras' own formats and puts each whole
array on one device first (keras-team/keras#21634; ``sharded_weights``).
"""

import dataclasses
import json
import math
import os

import jax
import numpy as np

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A safetensors checkpoint that cannot be read or does not fit the model; the message
    names the file, tensor or value."""


def has_safetensors(directory):
    """True when ``directory`` holds ``model.safetensors`` or its sharded index."""
    return any(os.path.isfile(os.path.join(directory, name)) for name in (INDEX_FILE, SINGLE_FILE))


class SafetensorsFiles:
    """The tensors of a single-file or sharded safetensors checkpoint, opened lazily.

    Use as a context manager (``with SafetensorsFiles(directory) as files:``); the open
    files are closed on exit.
    """

    def __init__(self, directory):
        self.directory = directory
        self.weight_map = _weight_map(directory)  # tensor name -> file name
        self._open = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def names(self):
        return sorted(self.weight_map)

    def _slice(self, name):
        if name not in self.weight_map:
            raise CheckpointError(f"checkpoint {self.directory!r} has no tensor {name!r}")
        filename = self.weight_map[name]
        if filename not in self._open:
            from safetensors import safe_open

            path = os.path.join(self.directory, filename)
            if not os.path.isfile(path):
                raise CheckpointError(f"checkpoint {self.directory!r}: {INDEX_FILE} lists {filename!r}, which is missing")
            handle = safe_open(path, framework="numpy")
            self._open[filename] = handle.__enter__()
        return self._open[filename].get_slice(name)

    def shape(self, name):
        return tuple(self._slice(name).get_shape())

    def read(self, name, index=()):
        """The numpy array of ``name[index]`` (index: a tuple of slices), read from disk."""
        return self._slice(name)[index] if index else self._slice(name)[:]


def _weight_map(directory):
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as file:
            weight_map = json.load(file).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path!r} has no 'weight_map' of tensor names to files")
        return weight_map
    if os.path.isfile(os.path.join(directory, SINGLE_FILE)):
        from safetensors import safe_open

        with safe_open(os.path.join(directory, SINGLE_FILE), framework="numpy") as file:
            return {name: SINGLE_FILE for name in file.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    raise CheckpointError(f"{directory!r} holds no {SINGLE_FILE} and no {INDEX_FILE}")


@dataclasses.dataclass(frozen=True)
class TensorView:
    """How a model weight is a file's tensor: ``transpose(reshape(tensor, split), axes)``.

    name: the tensor's name in the file. split: the file tensor's shape with dimension
    ``split_dim`` split into two (``(H, D, C)`` for a (H*D, C) ``q_proj.weight``,
    ``split_dim=0``; ``(C, H, D)`` for a (C, H*D) ``o_proj.weight``, ``split_dim=1``);
    None keeps the file's shape. axes: the transpose from that shape to the weight's
    (None: none).
    """

    name: str
    split: tuple | None = None
    split_dim: int = 0
    axes: tuple | None = None

    @property
    def names(self):
        """The file tensors this weight is made of."""
        return (self.name,)

    def shape_in(self, files):
        """The weight's shape, from the file's tensor."""
        return self.weight_shape(files.shape(self.name))

    def file_tensors(self, weight):
        """``{file tensor name: array}`` of the whole weight."""
        return {self.name: self.to_file(weight)}

    def weight_shape(self, file_shape):
        if self.split is not None and math.prod(self.split) != math.prod(file_shape):
            raise CheckpointError(f"tensor {self.name!r} has shape {tuple(file_shape)}, which does not split into {self.split}")
        shape = self.split or tuple(file_shape)
        return tuple(shape[a] for a in self.axes) if self.axes else tuple(shape)

    def to_weight(self, array):
        """The whole weight from the whole file tensor."""
        array = array.reshape(self.split) if self.split else array
        return np.transpose(array, self.axes) if self.axes else array

    def to_file(self, weight):
        """The file tensor from the whole weight (the inverse of ``to_weight``)."""
        array = np.transpose(weight, np.argsort(self.axes)) if self.axes else np.asarray(weight)
        if self.split is None:
            return array
        f = self.split_dim
        return array.reshape(array.shape[:f] + (-1,) + array.shape[f + 2 :])

    def read(self, files, weight_index):
        """The slice ``weight[weight_index]`` read from ``files``: only the part of the
        file tensor it covers (a split pair reads whole inner rows of the outer range)."""
        split = self.split or files.shape(self.name)
        weight_shape = tuple(split[a] for a in self.axes) if self.axes else tuple(split)
        index = _full_index(weight_index, weight_shape)
        split_index = tuple(index[self.axes.index(d)] for d in range(len(split))) if self.axes else index
        if self.split is None:
            block = files.read(self.name, split_index)
        else:
            f = self.split_dim
            outer, inner, inner_size = split_index[f], split_index[f + 1], split[f + 1]
            rows = slice(outer.start * inner_size, outer.stop * inner_size)
            block = files.read(self.name, split_index[:f] + (rows,) + split_index[f + 2 :])
            block = block.reshape(block.shape[:f] + (outer.stop - outer.start, inner_size) + block.shape[f + 1 :])
            block = block[(slice(None),) * (f + 1) + (inner,)]
        return np.transpose(block, self.axes) if self.axes else block


@dataclasses.dataclass(frozen=True)
class StackedView:
    """A weight (E, ...) whose row j is file tensor ``parts[j]`` seen through that
    ``TensorView``: the experts of a Mixture-of-Experts layer, which Hugging Face
    checkpoints keep one tensor per expert (``...experts.<j>.w1.weight`` (F, C) ->
    ``expert_gate[j]`` (C, F)).

    ``read`` of a slice opens only the experts' tensors in its E range, and only the
    part of each that the rest of the slice covers.
    """

    parts: tuple  # E TensorViews, expert j's in place j

    @property
    def name(self):
        """Both ends of the stack, for messages: ``'a.experts.0.w1.weight' .. 'a.experts.3.w1.weight'``."""
        return f"{self.parts[0].name} .. {self.parts[-1].name}"

    @property
    def names(self):
        return tuple(part.name for part in self.parts)

    def shape_in(self, files):
        """(E, *each expert's weight shape); the E tensors must agree."""
        shapes = {part.name: part.shape_in(files) for part in self.parts}
        if len(set(shapes.values())) != 1:
            raise CheckpointError(f"the stacked tensors {self.name} differ in shape: {shapes}")
        return (len(self.parts), *next(iter(shapes.values())))

    def file_tensors(self, weight):
        """``{expert j's tensor name: its array}`` of the whole stacked weight (E, ...)."""
        if len(weight) != len(self.parts):
            raise CheckpointError(f"a stacked weight of {len(weight)} rows for the {len(self.parts)} tensors {self.name}")
        return {part.name: part.to_file(row) for part, row in zip(self.parts, weight)}

    def to_weight(self, arrays):
        """The whole weight (E, ...) from the E whole file tensors (in ``parts`` order)."""
        return np.stack([part.to_weight(array) for part, array in zip(self.parts, arrays)])

    def read(self, files, weight_index):
        """``weight[weight_index]``: experts ``weight_index[0]`` only, each read by its
        TensorView for the rest of the index."""
        index = tuple(weight_index) or (slice(None),)
        start, stop = index[0].indices(len(self.parts))[:2]
        return np.stack([self.parts[j].read(files, index[1:]) for j in range(start, stop)])


def _full_index(index, shape):
    """``index`` (tuple of slices, possibly shorter than ``shape``) with explicit bounds."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(slice(*s.indices(size)[:2]) for s, size in zip(index, shape))


def load_into(variable, files, view, on_read=None):
    """Assign ``variable`` from ``files`` through ``view`` (a ``TensorView`` or
    ``StackedView``), each device's shard read from disk by itself and placed on its
    device (``jax.make_array_from_callback``).

    The variable's current value (a fresh model's initialisation) is freed first, so a
    device never holds both it and the file's shard: per-device memory stays at the
    sharded size through the whole load (``zoo bench hf-load``: 1.21x for Llama-3.2-1B
    under fsdp and tp while both were alive, the embedding being 21% of the weights).
    A read that fails midway leaves that variable without a value: load into a model
    built for it (``from_preset`` does).

    on_read: optional ``callback(device_slice_array)`` seeing each slice as read (tests
    count the bytes each device receives). Raises ``CheckpointError`` on a shape mismatch.
    """
    shape = view.shape_in(files)
    if shape != tuple(variable.shape):
        raise CheckpointError(
            f"tensor {view.name!r} gives shape {shape} but the model's {variable.path!r} is {tuple(variable.shape)}"
        )
    current = variable.value
    dtype, sharding = np.dtype(current.dtype), current.sharding
    current.delete()

    def read_slice(index):
        block = view.read(files, index).astype(dtype, copy=False)
        if on_read is not None:
            on_read(block)
        return block

    variable.assign(jax.make_array_from_callback(shape, sharding, read_slice))


def write_safetensors(tensors, directory, *, max_file_bytes=None, metadata=None):
    """Write ``{name: numpy array}`` as ``model.safetensors``, or, past ``max_file_bytes``,
    as ``model-0000k-of-0000n.safetensors`` files with ``model.safetensors.index.json``.
    Returns the file names written."""
    from safetensors.numpy import save_file

    groups = _file_groups(tensors, max_file_bytes)
    metadata = {"format": "pt", **(metadata or {})}  # "pt": transformers reads the file as its own
    if len(groups) == 1:
        save_file({name: np.ascontiguousarray(tensors[name]) for name in groups[0]}, os.path.join(directory, SINGLE_FILE), metadata)
        return [SINGLE_FILE]
    names = [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
    for filename, group in zip(names, groups):
        save_file({name: np.ascontiguousarray(tensors[name]) for name in group}, os.path.join(directory, filename), metadata)
    index = {
        "metadata": {"total_size": int(sum(np.asarray(t).nbytes for t in tensors.values()))},
        "weight_map": {name: filename for filename, group in zip(names, groups) for name in group},
    }
    with open(os.path.join(directory, INDEX_FILE), "w", encoding="utf-8") as file:
        json.dump(index, file, indent=2, sort_keys=True)
    return names + [INDEX_FILE]


def _file_groups(tensors, max_file_bytes):
    """Tensor names in order, cut into groups of at most ``max_file_bytes`` (a bigger tensor alone)."""
    groups, size = [[]], 0
    for name, tensor in tensors.items():
        nbytes = np.asarray(tensor).nbytes
        if max_file_bytes and groups[-1] and size + nbytes > max_file_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups
