"""LoRA adapters on their own: ``save_lora`` / ``load_lora`` of only the ``lora_kernel_a/b`` factors.

File layout (HDF5): one group per adapted layer, named by the layer's variable-path prefix
(``block_0/attention/query``), holding datasets ``lora_kernel_a`` and ``lora_kernel_b``
and attributes ``rank`` and ``alpha``; the root's attributes say ``format = "zoo-lora"``
and ``format_version``. A few hundred kilobytes where the model is megabytes.
"""

import contextlib
import math
import os
import tempfile

import h5py
import numpy as np

from zoo.file_kinds import regular_file
from zoo.layers import kernel_variable
from zoo.presets.permissions import honour_umask
from zoo.presets.sharded_weights import assign_from_host
from zoo.training.lora._layers import (
    LORA_WEIGHTS,
    enable_lora,
    in_layers_form,
    layer_prefix,
    lora_layers,
    lora_target_layers,
)

LORA_FORMAT = "zoo-lora"
LORA_FORMAT_VERSION = 1


def save_lora(model, path):
    """Write the LoRA factors of ``model`` to ``path`` (``.h5``), atomically; a stacked
    GPT's, block by block as its layers would hold them (``in_layers_form``)."""
    layers = lora_layers(in_layers_form(model))
    if not layers:
        raise ValueError(f"model {model.name!r} has no LoRA-enabled layer; enable LoRA before saving an adapter")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".h5", prefix=".partial-", dir=directory)
    os.close(handle)
    try:
        with h5py.File(partial, "w") as file:
            file.attrs["format"] = LORA_FORMAT
            file.attrs["format_version"] = LORA_FORMAT_VERSION
            for layer in layers:
                group = file.create_group(layer_prefix(layer))
                group.attrs["rank"] = layer.lora_rank
                group.attrs["alpha"] = layer.lora_alpha
                for name in LORA_WEIGHTS:
                    group.create_dataset(name, data=np.asarray(getattr(layer, name).value))
        os.replace(honour_umask(partial), path)  # mkstemp made it 0600
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def load_lora(model, path):
    """Load an adapter written by ``save_lora`` into ``model``: LoRA is enabled (rank and
    alpha from the file, factors laid out like their kernels) on the layers the file
    names, where not already, and each factor goes from the host into its sharding.
    Returns the adapted layers.

    The file is data from elsewhere: every factor's shape and dtype (from the HDF5
    headers), rank and alpha are checked against the layer it adapts before any factor is
    read, and each factor read is checked to be finite; errors name the file."""
    targets = {layer_prefix(layer): layer for layer in lora_target_layers(model)}
    with _open_lora(path) as (path, file):
        headers = _lora_headers(path, file)
        unknown = sorted(set(headers) - set(targets))
        if unknown:
            raise ValueError(
                f"LoRA file {path!r} adapts {unknown}, which model {model.name!r} lacks; its Dense layers are {sorted(targets)}"
            )
        enabled = sorted(layer_prefix(layer) for layer in lora_layers(model) if layer_prefix(layer) not in headers)
        if enabled:
            raise ValueError(f"model {model.name!r} has LoRA on {enabled}, which LoRA file {path!r} does not hold")
        for prefix, (rank, alpha, datasets) in headers.items():
            _check_header(path, prefix, rank, alpha, datasets, tuple(kernel_variable(targets[prefix]).shape))
        adapters = {
            prefix: (rank, alpha, _read(path, prefix, datasets)) for prefix, (rank, alpha, datasets) in headers.items()
        }
    layers = []
    for prefix, (rank, alpha, values) in adapters.items():
        layer = targets[prefix]
        if not layer.lora_enabled:
            enable_lora(model, rank, alpha=alpha, layers=[layer])
        elif (layer.lora_rank, layer.lora_alpha) != (rank, alpha):
            raise ValueError(
                f"layer {prefix!r} has LoRA rank {layer.lora_rank}, alpha {layer.lora_alpha}; "
                f"LoRA file {path!r} holds rank {rank}, alpha {alpha}"
            )
        variables = [getattr(layer, name) for name in LORA_WEIGHTS]
        with assign_from_host(variables):
            for variable, value in zip(variables, values):
                variable.assign(value)
        layers.append(layer)
    return layers


def read_lora(path):
    """``{prefix: (rank, alpha, (a, b))}`` from a LoRA file, with clear errors naming it
    (factors stored as floating point and finite; shapes not checked against a model)."""
    with _open_lora(path) as (path, file):
        return {
            prefix: (rank, alpha, _read(path, prefix, datasets))
            for prefix, (rank, alpha, datasets) in _lora_headers(path, file).items()
        }


@contextlib.contextmanager
def _open_lora(path):
    """``(path, h5py.File)`` of a LoRA file, refused by type before opening (a FIFO, a
    device) and when it is not a zoo LoRA file this version reads."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"no LoRA file at {path!r}")
    regular_file(path, error=ValueError, what="a LoRA file (.h5)")
    try:
        file = h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"LoRA file {path!r} is not a readable HDF5 file: {error}") from None
    with file:
        _check_format(path, file.attrs)
        yield path, file


def _lora_headers(path, file):
    """``{prefix: (rank, alpha, (dataset a, dataset b))}``: what the file declares, no factor read."""
    adapters = {}
    try:
        file.visititems(lambda name, item: _collect(path, name, item, adapters))
    except OSError as error:
        raise ValueError(f"LoRA file {path!r} is not a readable HDF5 file: {error}") from None
    if not adapters:
        raise ValueError(f"LoRA file {path!r} holds no adapted layer")
    return adapters


def _check_format(path, attrs):
    if attrs.get("format") != LORA_FORMAT:
        raise ValueError(f"{path!r} is not a zoo LoRA file (format {attrs.get('format')!r}, expected {LORA_FORMAT!r})")
    version = int(attrs.get("format_version", 0))
    if not 1 <= version <= LORA_FORMAT_VERSION:
        raise ValueError(
            f"LoRA file {path!r} has format version {version}; this keras-zoo reads 1 to {LORA_FORMAT_VERSION}"
        )


def _collect(path, name, item, adapters):
    if not isinstance(item, h5py.Group) or "rank" not in item.attrs:
        return
    missing = [n for n in LORA_WEIGHTS if not isinstance(item.get(n), h5py.Dataset)]
    if missing:
        raise ValueError(f"LoRA file {path!r}: layer {name!r} lacks {missing}")
    for factor in LORA_WEIGHTS:
        _check_stored(path, f"{name}/{factor}", item[factor])
    rank, alpha = item.attrs["rank"], item.attrs["alpha"]
    if not (np.ndim(rank) == 0 and np.issubdtype(np.asarray(rank).dtype, np.integer) and int(rank) >= 1):
        raise ValueError(f"LoRA file {path!r}: layer {name!r} has rank {rank!r}, not a positive integer")
    if not (
        np.ndim(alpha) == 0 and np.issubdtype(np.asarray(alpha).dtype, np.number) and math.isfinite(alpha) and alpha > 0
    ):
        raise ValueError(f"LoRA file {path!r}: layer {name!r} has alpha {alpha!r}, not a finite number > 0")
    alpha = int(alpha) if float(alpha).is_integer() else float(alpha)
    adapters[name] = (int(rank), alpha, tuple(item[n] for n in LORA_WEIGHTS))


def _check_stored(path, name, dataset):
    """A factor stores every value it declares (``save_lora`` writes them whole, uncompressed):
    a header declaring more than the file holds is refused before anything is read."""
    declared = dataset.size * dataset.dtype.itemsize
    stored = dataset.id.get_storage_size()
    if dataset.compression is not None or stored < declared:
        raise ValueError(
            f"LoRA file {path!r}: {name} declares shape {tuple(dataset.shape)} ({declared:,} bytes) but stores "
            f"{stored:,} bytes{' compressed' if dataset.compression else ''}; zoo LoRA files store their factors whole"
        )


def check_lora_file(path):
    """Raise ``ValueError`` naming ``path`` unless it is a zoo LoRA file whose headers are
    sound (type, format, ranks, alphas, each factor's dtype and stored size); no factor is
    read. ``zoo export --lora`` calls it before loading the model."""
    with _open_lora(path) as (path, file):
        for prefix, (_, _, datasets) in _lora_headers(path, file).items():
            for name, dataset in zip(LORA_WEIGHTS, datasets):
                if dataset.dtype.kind != "f":
                    raise ValueError(
                        f"LoRA file {path!r}: {prefix}/{name} is stored as {dataset.dtype}; LoRA factors are floating point"
                    )


def _check_header(path, prefix, rank, alpha, datasets, kernel_shape):
    """The factors' declared shapes and dtypes against the kernel they adapt, before reading them."""
    expected = (kernel_shape[:-1] + (rank,), (rank, kernel_shape[-1]))
    if rank > min(math.prod(kernel_shape[:-1]), kernel_shape[-1]):
        raise ValueError(
            f"LoRA file {path!r}: layer {prefix!r} has rank {rank}, above the kernel {kernel_shape}'s smaller side"
        )
    for name, dataset, shape in zip(LORA_WEIGHTS, datasets, expected):
        if tuple(dataset.shape) != shape:
            raise ValueError(
                f"LoRA file {path!r}: {prefix}/{name} declares shape {tuple(dataset.shape)}; the model's kernel "
                f"{kernel_shape} at rank {rank} takes {shape} (refused before reading it)"
            )
        if dataset.dtype.kind != "f":
            raise ValueError(
                f"LoRA file {path!r}: {prefix}/{name} is stored as {dataset.dtype}; LoRA factors are floating point"
            )


def _read(path, prefix, datasets):
    """The factors' values, each finite and floating point."""
    values = []
    for name, dataset in zip(LORA_WEIGHTS, datasets):
        if dataset.dtype.kind != "f":
            raise ValueError(
                f"LoRA file {path!r}: {prefix}/{name} is stored as {dataset.dtype}; LoRA factors are floating point"
            )
        value = dataset[()]
        bad = np.size(value) - np.count_nonzero(np.isfinite(value))
        if bad:
            raise ValueError(f"LoRA file {path!r}: {prefix}/{name} holds {bad} NaN or infinite value(s)")
        values.append(value)
    return tuple(values)
