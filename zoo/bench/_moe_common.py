"""What the sections of ``zoo bench moe`` share: the mesh's devices and batch split, the
MoE layers and their experts' split, the compiled HLO's exchanges, gathers and reduces."""

import re

import numpy as np

from zoo import distribution as zd
from zoo._compat import sublayers
from zoo.distribution.axes import DATA, EXPERT
from zoo.layers.moe_feed_forward import MoEFeedForward
from zoo.measure.compiled_step import shard_bytes, state_shardings

SEED = 0
EXCHANGES_PER_BLOCK = 4  # dispatch and combine, forward and backward
EXPERT_WEIGHT = re.compile(r"/expert_(gate|up|down)$")  # MoEFeedForward's (E, C, F) / (E, F, C) weights
ARRAY_DIMS = re.compile(r"\[([0-9,]*)\]")  # the dims of each array of a CollectiveOp.shape
FLOAT_ITEMSIZES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}  # HLO dtype -> bytes: the token exchanges' buffers
EXCHANGE_KINDS = ("all-to-all", "ragged-all-to-all")  # the collectives tokens travel in over 'expert'


# --- what every section shares ----------------------------------------------------------


def mesh_devices(spec):
    return int(np.prod([size for _, size in zd.parse_mesh_spec(spec)]))


def batch_split(spec):
    """How many ways layout ``expert`` splits the batch on ``spec``: data x expert."""
    axes = dict(zd.parse_mesh_spec(spec))
    return axes.get(DATA, 1) * axes.get(EXPERT, 1)


def moe_layers(model):
    return [layer for layer in sublayers(model) if isinstance(layer, MoEFeedForward)]


def expert_split(model, distribution):
    """``(bytes of expert weights per device, the model's expert bytes, parts)``: parts =
    how many ways every expert weight is split (None if they differ)."""
    trainable, non_trainable, _, _ = state_shardings(model, distribution)
    pairs = zip(model.trainable_variables + model.non_trainable_variables, trainable + non_trainable)
    held, whole, parts = 0, 0, set()
    for variable, sharding in pairs:
        if EXPERT_WEIGHT.search(variable.path):
            mine, total = (
                shard_bytes(variable, sharding),
                int(np.prod(variable.shape)) * np.dtype(variable.dtype).itemsize,
            )
            held, whole = held + mine, whole + total
            parts.add(total / mine)
    return held, whole, parts.pop() if len(parts) == 1 else None


def _dims(op):
    return [tuple(int(x) for x in dims.split(",") if x) for dims in ARRAY_DIMS.findall(op.shape)]


def expert_weight_gathers(comms, width, hidden):
    """All-gathers executed per step whose buffer has an expert weight's (C, F) or (F, C)
    trailing dims, or that run over an axis that includes ``expert``."""
    matrices = {(width, hidden), (hidden, width)}

    def gathers_experts(op):
        return any(len(d) == 3 and d[1:] in matrices for d in _dims(op)) or bool(op.axes and EXPERT in op.axes)

    return sum(op.executions for op in comms.select("all-gather") if gathers_experts(op))


def expert_gradient_reduces(comms, width, hidden):
    """All-reduces over ``data`` executed per step whose buffers are expert-shaped (the
    experts' gradients: one per MoE block is the minimum, XLA may combine them)."""
    matrices = {(width, hidden), (hidden, width)}
    return sum(
        op.executions
        for op in comms.select("all-reduce", (DATA,))
        if any(len(d) == 3 and d[1:] in matrices for d in _dims(op))
    )


def exchange_ops(comms):
    """The all-to-alls and ragged all-to-alls over ``expert`` of a ``CommsReport``."""
    return [op for kind in EXCHANGE_KINDS for op in comms.select(kind, (EXPERT,))]


def exchange_totals(comms):
    """``(token all-to-alls executed, count all-to-alls executed, bytes sent, dtype moved)``
    over ``expert`` per step: the floating exchanges (ragged ones too), the integer
    [N_e, E_l] counts and offsets, the bytes of all of them (a ragged all-to-all's: its
    whole send buffer, a bound), and the tokens' dtype as compiled (XLA:CPU widens bf16 to f32)."""
    ops = exchange_ops(comms)
    floating = [op for op in ops if _dtype(op) in FLOAT_ITEMSIZES]
    moved = {_dtype(op) for op in floating}
    if len(moved) > 1:
        raise ValueError(f"the token all-to-alls move several dtypes {sorted(moved)}; the minimum needs one")
    tokens = sum(op.executions for op in floating)
    return (
        tokens,
        sum(op.executions for op in ops) - tokens,
        sum(op.sent_bytes * op.executions for op in ops),
        moved.pop() if moved else None,
    )


def _dtype(op):
    return op.shape.split("[", 1)[0]


def compute_dtype(precision):
    return "bf16" if precision == "mixed_bfloat16" else "f32"
