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

The folder is data from elsewhere: ``SafetensorsFiles`` opens only files inside it
(``zoo.presets._safety.inside_folder``; the whole index is checked before any file is
opened), refuses a header safetensors finds invalid (a truncated file, shapes that say
more bytes than the file has), a tensor stored as an integer or bool, and, slice by
slice as each device's shard is read (no tensor is gathered to check it), a NaN or an
infinity: the finiteness the zoo's own checkpoints require of their weights.

Why not ``keras.Model.load_weights``: it reads only Keras' own formats and puts each whole
array on one device first (keras-team/keras#21634; ``sharded_weights``).
"""

import dataclasses
import json
import math
import os

import jax
import numpy as np

from zoo.file_kinds import regular_file
from zoo.presets._safety import inside_folder
from zoo.presets.permissions import honour_umask

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# safetensors dtype -> numpy: the floating types a weight may be stored as (cast to the
# variable's dtype on reading); integers and bool are quantized or damaged checkpoints,
# F8 types come with scales the zoo does not apply (and quantization_config is refused)
FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


class CheckpointError(RuntimeError):
    """A safetensors checkpoint that cannot be read, cannot be trusted or does not fit the
    model; the message names the file, tensor or value. A ``RuntimeError``: on the command
    line a checkpoint that cannot be used exits 1 (docs/cli.md)."""


def has_safetensors(directory):
    """True when ``directory`` holds ``model.safetensors`` or its sharded index (of any kind:
    a directory or FIFO by that name is a damaged checkpoint, which opening it refuses)."""
    return any(os.path.lexists(os.path.join(directory, name)) for name in (INDEX_FILE, SINGLE_FILE))


class SafetensorsFiles:
    """The tensors of a single-file or sharded safetensors checkpoint, checked on opening.

    Opening checks, before any tensor is read: every file named (the index's
    ``weight_map``) resolves inside ``directory`` and exists, the whole index first;
    every file's header is valid safetensors (its tensors cover the file exactly: a
    truncated file or a shape that says more bytes than the file has is refused); each
    tensor the index lists is in its file and stored as a floating type
    (``FLOAT_DTYPES``). Each ``read`` checks that the slice it read is finite. Errors are
    ``CheckpointError`` naming the file and tensor.

    Use as a context manager (``with SafetensorsFiles(directory) as files:``); the open
    files are closed on exit.
    """

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        index = _read_index(self.directory)  # None: one model.safetensors
        filenames = sorted(set(index.values())) if index is not None else [SINGLE_FILE]
        self._paths = {filename: _weight_file(self.directory, filename) for filename in filenames}
        self._open = {}
        try:
            for filename, path in self._paths.items():
                self._open[filename] = _open_safetensors(path)
            self.weight_map = (
                index if index is not None else {name: SINGLE_FILE for name in self._open[SINGLE_FILE].keys()}
            )  # noqa: SIM118
            self._check_tensors()
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def names(self):
        return sorted(self.weight_map)

    def path_of(self, name):
        """The file that holds tensor ``name``."""
        return self._paths[self.weight_map[name]]

    def _check_tensors(self):
        keys = {filename: set(handle.keys()) for filename, handle in self._open.items()}
        for name, filename in self.weight_map.items():
            if name not in keys[filename]:
                raise CheckpointError(f"{self.path_of(name)!r} has no tensor {name!r}, which {INDEX_FILE} places there")
            stored = self._open[filename].get_slice(name).get_dtype()
            if stored not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"tensor {name!r} in {self.path_of(name)!r} is stored as {stored}; the model's weights are floating "
                    f"point, read from {sorted(FLOAT_DTYPES)} only (an integer or bool tensor is a quantized or damaged checkpoint)"
                )

    def _slice(self, name):
        if name not in self.weight_map:
            raise CheckpointError(f"checkpoint {self.directory!r} has no tensor {name!r}")
        return self._open[self.weight_map[name]].get_slice(name)

    def shape(self, name):
        return tuple(self._slice(name).get_shape())

    def read(self, name, index=()):
        """The numpy array of ``name[index]`` (index: a tuple of slices), read from disk;
        ``CheckpointError`` if it holds a NaN or an infinity."""
        block = self._slice(name)[index] if index else self._slice(name)[:]
        bad = np.size(block) - np.count_nonzero(np.isfinite(block))
        if bad:
            raise CheckpointError(
                f"tensor {name!r} in {self.path_of(name)!r} holds {bad} NaN or infinite value(s) (in the slice "
                f"{_index_text(index)} of shape {tuple(self.shape(name))}): a model from it computes NaN"
            )
        return block


def _index_text(index):
    return (
        "[" + ", ".join(f"{s.start or 0}:{'' if s.stop is None else s.stop}" for s in index) + "]" if index else "[:]"
    )


def _read_index(directory):
    """The index's ``weight_map`` ({tensor name: file name}), every file checked to be
    inside ``directory`` and present before any is opened; None when there is no index
    and ``model.safetensors`` is the checkpoint."""
    index_path = os.path.join(directory, INDEX_FILE)
    if not os.path.lexists(index_path):
        if not os.path.lexists(os.path.join(directory, SINGLE_FILE)):
            raise CheckpointError(f"{directory!r} holds no {SINGLE_FILE} and no {INDEX_FILE}")
        return None
    inside_folder(directory, INDEX_FILE, listed_in="the folder", error=CheckpointError)
    regular_file(index_path, error=CheckpointError, what="a JSON file")
    try:
        with open(index_path, encoding="utf-8") as file:
            index = json.load(file)
    except (OSError, ValueError, RecursionError) as error:  # ValueError: not JSON, or not UTF-8
        raise CheckpointError(f"{index_path!r} cannot be read as JSON ({error})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path!r} has no 'weight_map' of tensor names to files")
    first_tensor = {}  # each file once (an index lists hundreds of tensors in a few files)
    for name, filename in weight_map.items():
        first_tensor.setdefault(filename if isinstance(filename, str) else repr(filename), (name, filename))
    for name, filename in first_tensor.values():
        path = inside_folder(directory, filename, listed_in=f"{INDEX_FILE} (tensor {name!r})", error=CheckpointError)
        if not os.path.exists(path):
            raise CheckpointError(f"{index_path!r} places tensor {name!r} in {filename!r}, which is missing")
        regular_file(path, error=CheckpointError, what="a safetensors file")
    return weight_map


def _weight_file(directory, filename):
    path = inside_folder(
        directory, filename, listed_in=INDEX_FILE if filename != SINGLE_FILE else "the folder", error=CheckpointError
    )
    if not os.path.exists(path):
        raise CheckpointError(f"{path!r} is missing")
    return regular_file(path, error=CheckpointError, what="a safetensors file")


def _open_safetensors(path):
    """``safe_open(path)`` entered; ``CheckpointError`` naming ``path`` when its header is
    not valid safetensors (safetensors checks that the tensors cover the file exactly)."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(path, framework="numpy").__enter__()
    except (SafetensorError, OSError) as error:
        raise CheckpointError(
            f"{path!r} is not a readable safetensors file ({os.path.getsize(path):,} bytes; {error}): truncated, damaged or another format"
        ) from None


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
            raise CheckpointError(
                f"tensor {self.name!r} has shape {tuple(file_shape)}, which does not split into {self.split}"
            )
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
            raise CheckpointError(
                f"a stacked weight of {len(weight)} rows for the {len(self.parts)} tensors {self.name}"
            )
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
        block = _cast(view, view.read(files, index), dtype)
        if on_read is not None:
            on_read(block)
        return block

    variable.assign(jax.make_array_from_callback(shape, sharding, read_slice))


def read_whole(view, files, dtype=np.float32):
    """The whole weight ``view`` names, read into host memory as ``dtype``: a kernel quantized
    as it is read (``zoo.layers.fill_quantized``), whose device variable is no float array."""
    return _cast(view, view.read(files, ()), np.dtype(dtype))


def _cast(view, block, dtype):
    """``block`` (finite, as read) as the variable's ``dtype``; ``CheckpointError`` when a
    value is beyond that dtype's range (a float64 1e300 into float32 becomes infinite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast = block.astype(dtype, copy=False)
    if cast is not block and not np.isfinite(cast).all():
        raise CheckpointError(
            f"tensor {view.name!r} holds values beyond the range of the model's {dtype} (stored as {block.dtype})"
        )
    return cast


def save_tensor_file(tensors, path, metadata):
    """``{name: numpy array}`` as one safetensors file at ``path``, with the mode the umask
    allows (the ``safetensors`` library creates it 0600)."""
    from safetensors.numpy import save_file

    save_file({name: np.ascontiguousarray(array) for name, array in tensors.items()}, path, metadata)
    honour_umask(path)


def write_safetensors(tensors, directory, *, max_file_bytes=None, metadata=None):
    """Write ``{name: numpy array}`` as ``model.safetensors``, or, past ``max_file_bytes``,
    as ``model-0000k-of-0000n.safetensors`` files with ``model.safetensors.index.json``.
    Returns the file names written."""
    groups = _file_groups(tensors, max_file_bytes)
    metadata = {"format": "pt", **(metadata or {})}  # "pt": transformers reads the file as its own
    if len(groups) == 1:
        save_tensor_file({name: tensors[name] for name in groups[0]}, os.path.join(directory, SINGLE_FILE), metadata)
        return [SINGLE_FILE]
    names = [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
    for filename, group in zip(names, groups):
        save_tensor_file({name: tensors[name] for name in group}, os.path.join(directory, filename), metadata)
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
