"""``describe(model)``: what each parallel layer will actually run under the current distribution.

One line per zoo parallel layer (attention, tensor-parallel Dense, MLP): the kernel, the
mesh axes with their sizes, and the collectives a call runs, e.g.::

    block_0/attention: ring attention over seq (4), K/V ppermute x3 per call
    block_0/mlp: tensor-parallel MLP over model (2), 32 of 64 hidden features per device, ...

A layer says it itself, through its ``describe_parallelism()`` method (this package may
not import ``zoo.layers``: the duck type is the contract). A described layer's own
sublayers (an MLP's projections) are not listed again; a layer with no such method is
skipped. Lines are in path order (``block_2`` before ``block_10``), resolved now from
``keras.distribution.distribution()``: set the distribution first (as ``fit`` runs
under it) and build the model under it.
"""

import re

from zoo._compat import sublayers


def describe(model):
    """``["<path>: <what runs>", ...]``, one per parallel layer of ``model`` (a model or a layer)."""
    layers = [model, *sublayers(model)]
    parallel = [layer for layer in layers if callable(getattr(layer, "describe_parallelism", None))]
    covered = {id(inner) for layer in parallel for inner in sublayers(layer)}
    described = sorted(
        (layer for layer in parallel if id(layer) not in covered), key=lambda layer: _natural(_path(layer))
    )
    return [f"{_path(layer)}: {layer.describe_parallelism()}" for layer in described]


def print_description(model, file=None):
    """Prints ``describe(model)``, one line each; returns the lines."""
    lines = describe(model)
    for line in lines:
        print(line, file=file)
    return lines


def _path(layer):
    return getattr(layer, "path", None) or layer.name


def _natural(path):
    """Sort key: ``block_2`` before ``block_10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]
