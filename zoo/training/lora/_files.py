"""LoRA adapters on their own: ``save_lora`` / ``load_lora`` of only the ``lora_kernel_a/b`` factors.

File layout (HDF5): one group per adapted layer, named by the layer's variable-path prefix
(``block_0/attention/query``), holding datasets ``lora_kernel_a`` and ``lora_kernel_b``
and attributes ``rank`` and ``alpha``; the root's attributes say ``format = "zoo-lora"``
and ``format_version``. A few hundred kilobytes where the model is megabytes.
"""

import os
import tempfile

import h5py
import numpy as np

from zoo.presets.permissions import honour_umask
from zoo.presets.sharded_weights import assign_from_host
from zoo.training.lora._layers import LORA_WEIGHTS, enable_lora, layer_prefix, lora_layers, lora_target_layers

LORA_FORMAT = "zoo-lora"
LORA_FORMAT_VERSION = 1


def save_lora(model, path):
    """Write the LoRA factors of ``model`` to ``path`` (``.h5``), atomically."""
    layers = lora_layers(model)
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
    Returns the adapted layers."""
    adapters = read_lora(path)
    targets = {layer_prefix(layer): layer for layer in lora_target_layers(model)}
    unknown = sorted(set(adapters) - set(targets))
    if unknown:
        raise ValueError(
            f"LoRA file {path!r} adapts {unknown}, which model {model.name!r} lacks; its Dense layers are {sorted(targets)}"
        )
    enabled = sorted(layer_prefix(layer) for layer in lora_layers(model) if layer_prefix(layer) not in adapters)
    if enabled:
        raise ValueError(f"model {model.name!r} has LoRA on {enabled}, which LoRA file {path!r} does not hold")
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
    """``{prefix: (rank, alpha, (a, b))}`` from a LoRA file, with clear errors naming it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"no LoRA file at {path!r}")
    try:
        with h5py.File(path, "r") as file:
            _check_format(path, file.attrs)
            adapters = {}
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
    missing = [n for n in LORA_WEIGHTS if n not in item]
    if missing:
        raise ValueError(f"LoRA file {path!r}: layer {name!r} lacks {missing}")
    alpha = item.attrs["alpha"]
    alpha = int(alpha) if float(alpha).is_integer() else float(alpha)
    adapters[name] = (int(item.attrs["rank"]), alpha, tuple(item[n][()] for n in LORA_WEIGHTS))
