"""What a zoo checkpoint holds for a compiled Keras model, and the description that must match.

The arrays are two lists in variable order (lists, not dicts keyed by path: Keras paths
need not be unique, e.g. every ``Dropout`` owns a ``seed_generator/seed_generator_state``):

    {"model": [every model.variables value],            # weights, batch-norm statistics,
                                                         # seed-generator (RNG) states
     "optimizer": [every model.optimizer.variables value]}  # iteration count, learning rate,
                                                         # moments

Metric variables are left out: ``fit`` resets them at every epoch start anyway.

The description (saved as JSON next to the arrays) names the model and optimizer classes,
their configs and every variable's path, shape and dtype; a checkpoint whose description
differs from the model it is restored into is refused, naming the first differences.
"""

import json

import jax
import keras
import numpy as np

from zoo.training.checkpoints._block_forms import FORM_KEYS

GROUPS = ("model", "optimizer")  # the two lists of the array tree, in this order


def group_variables(model):
    """``{"model": [...], "optimizer": [...]}``: the Keras variables a checkpoint holds."""
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"model {model.name!r} has no optimizer: compile it before saving or restoring a checkpoint")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return {"model": list(model.variables), "optimizer": list(model.optimizer.variables)}


def state_tree(model):
    """The arrays to save: each variable's current value (a ``jax.Array`` in its sharding)."""
    return {group: [variable.value for variable in variables] for group, variables in group_variables(model).items()}


def abstract_state_tree(model):
    """``jax.ShapeDtypeStruct`` leaves carrying each variable's current sharding.

    Given to Orbax as the restore target, it puts every restored array straight into the
    layout the variable has now (replicated, or split over a model axis), on any mesh.
    """
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state_tree(model))


def assign_state(model, tree):
    """Assign a restored tree (same structure as ``state_tree``) to the model's variables.

    A variable whose value is not committed to a device (one built without a
    distribution) gets an uncommitted value again: a committed one would change the
    signature of Keras' compiled train step and cost a recompilation.
    """
    for group, variables in group_variables(model).items():
        for variable, value in zip(variables, tree[group], strict=True):
            variable.assign(value if variable.value.committed else np.asarray(value))


def describe(model):
    """JSON-ready description of what the arrays belong to.

    Names Keras makes unique per process (``adam_1``, ``seed_generator_1``) are left out
    of what is compared: the top-level ``name`` of the model and optimizer configs, and
    variable paths (kept for messages; variables are matched by position, shape, dtype).
    So is a constant learning rate: it is optimizer state (a variable, which callbacks
    such as ``ReduceLROnPlateau`` change), restored with the rest.
    """
    variables = group_variables(model)
    optimizer = model.optimizer
    return {
        "model_class": keras.saving.get_registered_name(type(model)),
        "model_config": json_ready(_without_name(model.get_config())),
        "optimizer": {
            "class": keras.saving.get_registered_name(type(optimizer)),
            "config": json_ready(_without_state(optimizer.get_config())),
        },
        "variables": {
            group: [[v.path, list(v.shape), str(v.dtype)] for v in group_vars]
            for group, group_vars in variables.items()
        },
    }


# Model-config keys that say how a run computes, not what its weights are: the kernel the
# distribution chose (context_attention), Megatron SP (megatron_sp, set by layout tp+sp),
# remat, and an MoE layer's capacity, exchange and grouped matmul. A checkpoint written
# under one value resumes under another (a layout change), so they are not compared; nor
# are the block form's keys (the pipeline's schedule, micro-batches, repeats): a change of
# form is matched variable by variable (``_block_forms``).
RUN_KEYS = ("context_attention", "megatron_sp", "remat", "capacity_factor", "expert_exchange", "grouped_matmul")


def without_run_keys(config):
    """``config`` (nested dicts and lists) without the ``RUN_KEYS`` and ``FORM_KEYS`` at any depth."""
    if isinstance(config, dict):
        return {key: without_run_keys(value) for key, value in config.items() if key not in RUN_KEYS + FORM_KEYS}
    if isinstance(config, list):
        return [without_run_keys(value) for value in config]
    return config


def differences(saved, current, limit=3, *, variables=True):
    """Human-readable differences between a saved and a current description (at most
    ``limit``); the model configs compared without their ``RUN_KEYS``; the variables
    only if ``variables``."""
    found = []
    saved = {**saved, "model_config": without_run_keys(saved.get("model_config"))}
    current = {**current, "model_config": without_run_keys(current["model_config"])}
    for key, label in (("model_class", "model class"), ("model_config", "model config"), ("optimizer", "optimizer")):
        _diff(saved.get(key), current[key], label, found)
    for group in GROUPS if variables else ():
        _diff_variables(saved.get("variables", {}).get(group), current["variables"][group], group, found)
    if len(found) > limit:
        found = found[:limit] + [f"and {len(found) - limit} more"]
    return found


def _diff(saved, current, label, found):
    if saved == current:
        return
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current), key=str):
            _diff(saved.get(key, "<absent>"), current.get(key, "<absent>"), f"{label} {key!r}", found)
        return
    found.append(f"{label} is {_short(saved)} in the checkpoint but {_short(current)} now")


def _diff_variables(saved, current, group, found):
    if saved is None:
        found.append(f"the checkpoint lists no {group} variables")
        return
    if len(saved) != len(current):
        found.append(f"the checkpoint has {len(saved)} {group} variables, the model {len(current)}")
    for index, (old, new) in enumerate(zip(saved, current)):
        if old[1:] != new[1:]:  # (shape, dtype); paths may differ by a per-process suffix
            found.append(
                f"{group} variable {index} is {old[0]} {tuple(old[1])} {old[2]} in the checkpoint "
                f"but {new[0]} {tuple(new[1])} {new[2]} now"
            )


def _without_name(config):
    return {key: value for key, value in config.items() if key != "name"}


def _without_state(optimizer_config):
    """An optimizer config without its name and, unless it is a schedule, its learning rate."""
    config = _without_name(optimizer_config)
    if isinstance(config.get("learning_rate"), (int, float)):
        del config["learning_rate"]
    return config


def learning_rate(model):
    """The optimizer's current learning rate as a float, or None for a schedule."""
    value = model.optimizer.get_config().get("learning_rate")
    return float(value) if isinstance(value, (int, float)) else None


def _short(value, width=60):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def json_ready(value):
    """Tuples become lists, numpy scalars plain numbers: what a JSON round trip gives back."""
    return json.loads(json.dumps(value, default=_json_default))


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)
