"""A GPT checkpoint restores whether its blocks are L layers or one stacked layer.

A GPT backbone holds its L transformer blocks in one of two forms:

    layers:  block_0/attention/query/kernel (C, H, D), ..., block_{L-1}/...   (no schedule)
    stacked: blocks/attention/query/kernel  (R, L/R, C, H, D)                 (layout pipeline)

with stack place (r, j) holding layer r * L/R + j, so ``stacked.reshape(L, ...)[l]`` is
layer l (the order ``save_to_hf`` unstacks them in). The optimizer's slots follow their
weights' paths with ``/`` as ``_`` (``adam_w/block_0_attention_query_kernel_momentum``,
``adam_w/blocks_attention_query_kernel_momentum``).

``BlockFormConversion`` matches a checkpoint's variables to a model's by those paths
(either way, or between two stackings (R, L/R) and (R', L/R') of the same L layers)
(the optimizer's own name and seed-generator suffixes aside, which Keras numbers per
process) and builds each of the model's arrays from the checkpoint's: copied, stacked
from L layers, or one layer sliced out of the stack. A seed generator the checkpoint
lacks keeps the model's state (the other form draws its dropout masks differently
anyway); one only the checkpoint has is dropped. Anything else unmatched is no form
change, and the checkpoint stays "a different model".

The checkpoint is read whole into host memory on each process (one copy of the
saved arrays) and each array put into the model's sharding from there.
"""

import dataclasses
import math
import re

import jax
import numpy as np

# GPTBackbone config keys that choose the form, or how a stacked form runs: not compared
# when a checkpoint of one form restores into the other.
FORM_KEYS = ("schedule", "micro_batches", "repeats", "scan_layers")

_LAYER_VARIABLE = re.compile(r"^block_(\d+)/(.+)$")  # model variable of block l
_STACKED_VARIABLE = re.compile(r"^blocks/(.+)$")
_LAYER_SLOT = re.compile(r"^block_(\d+)_(.+)$")  # optimizer slot (after the optimizer's name) of block l
_STACKED_SLOT = re.compile(r"^blocks_(.+)$")
_SEED_SUFFIX = re.compile(r"seed_generator_\d+")


@dataclasses.dataclass(frozen=True)
class _Key:
    """Where a variable sits: ``kind`` "plain", "layer" (block ``layer``) or "stacked"."""

    kind: str
    name: str
    layer: int | None = None


def _key(group, path):
    """The ``_Key`` of a variable of ``group`` ("model" or "optimizer") at ``path``."""
    if group == "optimizer":
        path = path.split("/", 1)[-1]  # adam_w/... or adam_w_1/...: the optimizer's per-process name
    path = _SEED_SUFFIX.sub("seed_generator", path)
    layer, stacked = (_LAYER_SLOT, _STACKED_SLOT) if group == "optimizer" else (_LAYER_VARIABLE, _STACKED_VARIABLE)
    if match := layer.match(path):
        return _Key("layer", match.group(2), int(match.group(1)))
    if match := stacked.match(path):
        return _Key("stacked", match.group(1))
    return _Key("plain", path)


def _is_seed_state(key):
    return key.name.endswith("seed_generator/seed_generator_state")


class BlockFormConversion:
    """How to build each of a model's variables from a checkpoint of the other block form.

    ``BlockFormConversion.between(saved, current)`` with the two descriptions'
    ``variables`` (``{group: [[path, shape, dtype], ...]}``) returns one, or None when
    the two are not the same model in the two forms.
    """

    def __init__(self, steps):
        self.steps = steps  # {group: [("copy", i) | ("stack", [i_0, ..]) | ("slice", i, l) | ("keep",)]}

    @classmethod
    def between(cls, saved, current):
        steps, used = {}, set()
        for group, variables in current.items():
            found = _Index(group, saved.get(group, []))
            steps[group] = []
            for path, shape, dtype in variables:
                step = found.step_for(_key(group, path), tuple(shape), dtype)
                if step is None:
                    return None
                steps[group].append(step)
            used |= {(group, index) for index in found.used}
        unused = [
            (group, index)
            for group, variables in saved.items()
            for index, (path, _, _) in enumerate(variables)
            if (group, index) not in used and not _is_seed_state(_key(group, path))
        ]
        if unused or not any(step[0] in ("stack", "slice") for group in steps for step in steps[group]):
            return None  # a variable left over, or nothing stacked or sliced: no form change
        return cls(steps)

    def apply(self, saved_tree, current_tree):
        """The model's tree (``state_tree``'s structure, each leaf in the sharding of
        ``current_tree``'s) built from ``saved_tree`` (host arrays of the saved form)."""
        return {
            group: [
                _placed(self._value(step, saved_tree[group], current), current)
                for step, current in zip(self.steps[group], current_tree[group], strict=True)
            ]
            for group in self.steps
        }

    @staticmethod
    def _value(step, saved, current):
        kind = step[0]
        if kind == "keep":
            return None
        if kind == "copy":
            return np.asarray(saved[step[1]])
        if kind == "stack":  # L layers (*block) -> (R, L/R, *block)
            return np.stack([np.asarray(saved[index]) for index in step[1]]).reshape(current.shape)
        _, index, layer = step  # "slice": layer l of a (R, L/R, *block) stack, or a restack
        stacked = np.asarray(saved[index])
        if layer is None:
            return stacked.reshape(current.shape)
        return stacked.reshape(-1, *current.shape)[layer]


class _Index:
    """A checkpoint group's variables by ``_Key``, and which of them a conversion used."""

    def __init__(self, group, variables):
        self.plain, self.layers, self.stacked = {}, {}, {}
        self.specs = [(tuple(shape), dtype) for _, shape, dtype in variables]
        self.used = set()
        for index, (path, _, _) in enumerate(variables):
            key = _key(group, path)
            if key.kind == "layer":
                self.layers.setdefault(key.name, {})[key.layer] = index
            elif key.kind == "stacked":
                self.stacked[key.name] = index
            else:
                self.plain[key.name] = index

    def step_for(self, key, shape, dtype):
        """The step building a variable at ``key`` of ``shape`` and ``dtype``, or None."""
        if key.kind == "plain":
            index = self.plain.get(key.name)
            if index is None:
                return ("keep",) if _is_seed_state(key) else None
            return self._use(("copy", index), [index], dtype, self.specs[index][0] == shape)
        if key.kind == "stacked":
            if key.name in self.stacked:  # another stacking (R', L/R'): the same L layers
                index = self.stacked[key.name]
                fits = math.prod(self.specs[index][0]) == math.prod(shape)
                return self._use(("slice", index, None), [index], dtype, fits)
            layers = self.layers.get(key.name, {})
            indices = [layers.get(layer) for layer in range(len(layers))]
            if not indices or None in indices:
                return None
            block = self.specs[indices[0]][0]  # (*block): every layer's shape, stacked as (R, L/R, *block)
            stack = shape[: len(shape) - len(block)]
            fits = all(self.specs[index][0] == block for index in indices)
            fits = fits and shape[len(stack) :] == block and math.prod(stack) == len(indices)
            return self._use(("stack", indices), indices, dtype, fits)
        if key.layer in self.layers.get(key.name, {}):
            index = self.layers[key.name][key.layer]
            return self._use(("copy", index), [index], dtype, self.specs[index][0] == shape)
        index = self.stacked.get(key.name)
        if index is None:
            return None
        stacked = self.specs[index][0]  # (R, L/R, *shape)
        stack, block = stacked[: len(stacked) - len(shape)], stacked[len(stacked) - len(shape) :]
        fits = block == shape and key.layer < math.prod(stack)
        return self._use(("slice", index, key.layer), [index], dtype, fits)

    def _use(self, step, indices, dtype, fits):
        """``step`` if the shapes ``fits`` and every saved variable it reads has ``dtype``."""
        if not fits or any(self.specs[index][1] != dtype for index in indices):
            return None
        self.used.update(indices)
        return step


def _placed(value, current):
    """``value`` (host array, or None: keep ``current``) in ``current``'s sharding."""
    if value is None:
        return current
    value = value.astype(current.dtype, copy=False)
    sharding = getattr(current, "sharding", None)
    if sharding is None:
        return value
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
