"""A step's time from its compiled program: a roofline per device, plus its collectives.

For one device of an SPMD program (every device runs the same one)::

    compute    = FLOPs / peak FLOP/s                    (the compiled program's FLOPs)
    memory     = bytes accessed / HBM bandwidth         (the compiled program's bytes)
    collective = sum over collectives of  count x latency + bytes sent / link bandwidth
    step       = max(compute, memory) + collective      (no overlap: an upper bound)
    overlapped = max(compute, memory, collective)       (perfect overlap: a lower bound)

A collective's link bandwidth is that of the slowest link its device groups cross: the
fast links (NVLink, ICI) while the group stays inside ``DeviceSpec.link_domain``
consecutive devices, the network beyond. Devices fill the mesh in row-major order (the
last axis varies fastest), as ``zoo.distribution.make_mesh`` and Keras lay them out, so
the last mesh axes are the ones that stay on a host.

MFU = model FLOPs per step / (step x devices x peak): the model's FLOPs
(``zoo.measure.mfu``), not the compiled program's, which include rematerialisation.

Where the device that compiled the step had its rates measured (``MEASURED_RATES``: what
its profiler showed its matmuls, its memory-bound ops, a Pallas kernel per attention score
and the gap between two ops reach), the device's work is instead the sum of its ops, each
at its own bound (``op_step_time`` over ``zoo.measure.hlo_ops.executed_ops``), and
``step = ops + collective``. docs/planning.md, "The step's time op by op".
"""

import dataclasses
import math

import numpy as np

__all__ = [
    "MEASURED_OP_STEPS",
    "MEASURED_RATES",
    "MEASURED_STEPS",
    "OpRates",
    "OpTime",
    "StepTime",
    "axes_bandwidth",
    "estimate_step_time",
    "kernel_scores",
    "measured_error",
    "mfu",
    "op_step_time",
]

# The roofline against steps measured on a device (docs/planning.md, "Known errors"): per
# device name, (step, planned seconds, measured seconds); the plan and ``zoo bench step``
# of the same step on the chip (recipes/tpu-v5e-1/issue43_rows.sh 5 and 17; JAX 0.10.2).
MEASURED_STEPS = {
    "tpu-v5e": (
        ("gpt_1b 8 layers, batch 2 x 2,048", 127.4e-3, 104.9e-3),
        ("gpt_1b 8 layers, batch 4 x 2,048", 212.6e-3, 196.2e-3),
        ("gpt_350m, batch 8 x 1,024", 380.8e-3, 248.7e-3),
        ("llama_3_2_1b full fine-tune, batch 2 x 2,048", 199.2e-3, 323.7e-3),
    ),
}


# The step's ops at the device's measured rates (op_step_time) against the same steps
# measured by zoo bench step on the device (docs/planning.md, "The step's time op by op"):
# per device name, (step, planned seconds, measured seconds).
MEASURED_OP_STEPS = {
    "tpu-v5e": (
        ("gpt_1b 8 layers, batch 2 x 2,048 (calibration)", 102.2e-3, 97.8e-3),
        ("gpt_350m, batch 8 x 1,024 (calibration)", 202.6e-3, 210.2e-3),
        ("llama_3_2_1b LoRA, batch 4 x 2,048 (calibration)", 390.7e-3, 407.2e-3),
        # planned on the chip by zoo bench step --plan, rows the rates were not read from
        ("gpt_1b 8 layers, batch 4 x 2,048", 200.5e-3, 188.6e-3),
        ("gpt_350m, batch 8 x 1,024 (planned from its compiled text)", 202.6e-3, 210.1e-3),
        ("qwen3_0.6b full fine-tune, batch 4 x 2,048, save_attention", 359.4e-3, 335.3e-3),
        ("gpt_1b 8 layers, batch 4 x 2,048, remat full, splash in (D, T) blocks", 237.3e-3, 253.8e-3),
        ("gpt_350m, batch 8 x 1,024, splash in (D, T) blocks", 172.7e-3, 179.3e-3),
        ("qwen3_0.6b full fine-tune, batch 4 x 2,048, save_attention, float32 AdamW", 320.6e-3, 337.7e-3),
        ("gpt_1b 8 layers, batch 1 x 8,192, remat full, the block mask read through its copy", 328.8e-3, 348.9e-3),
    ),
}


def measured_error(spec, by_ops=False):
    """``(lowest, highest, rows)``: the planned step over the measured one across the steps
    measured on ``spec``'s device (``MEASURED_OP_STEPS`` for the op-by-op time, else
    ``MEASURED_STEPS`` for the roofline), or None where none was measured."""
    rows = (MEASURED_OP_STEPS if by_ops else MEASURED_STEPS).get(spec.name)
    if not rows:
        return None
    ratios = [planned / measured for _, planned, measured in rows]
    return min(ratios), max(ratios), len(rows)


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds per training step on one device, by part (see the module docstring)."""

    compute_s: float
    memory_s: float
    collective_s: dict  # {"data": s, "model": s, "data,model": s}: per mesh axes spanned
    ops_s: float | None = None  # the step's ops at the device's measured rates (OpTime), where known

    @property
    def communication_s(self):
        return sum(self.collective_s.values())

    @property
    def device_s(self):
        """The device's own work: its ops at its measured rates where known, else the roofline."""
        return self.ops_s if self.ops_s is not None else max(self.compute_s, self.memory_s)

    @property
    def step_s(self):
        """No overlap of communication with compute: the estimate the plan ranks by."""
        return self.device_s + self.communication_s

    @property
    def overlapped_s(self):
        return max(self.device_s, self.communication_s)

    @property
    def bound(self):
        """What limits the step by the roofline: compute, memory or communication."""
        parts = {"compute": self.compute_s, "memory": self.memory_s, "communication": self.communication_s}
        return max(parts, key=parts.get)


def _crosses_domain(axes, mesh_axes, domain):
    """Whether a group varying along ``axes`` of the row-major mesh leaves ``domain`` devices."""
    if not domain or not axes:
        return False
    names = [name for name, _ in mesh_axes]
    ids = np.arange(math.prod(size for _, size in mesh_axes)).reshape([size for _, size in mesh_axes])
    index = tuple(slice(None) if name in axes else 0 for name in names)
    return len(np.unique(ids[index] // domain)) > 1


def axes_bandwidth(axes, mesh_axes, spec):
    """Bytes/s per device for a collective over ``axes`` of ``mesh_axes`` ([(name, size)])."""
    return spec.network_bandwidth if _crosses_domain(axes, mesh_axes, spec.link_domain) else spec.link_bandwidth


def estimate_step_time(*, flops, bytes_accessed, collectives, mesh_axes, spec, op_time=None):
    """``StepTime`` of one device.

    Args:
        flops: the compiled program's FLOPs per device (loops counted by trip count).
        bytes_accessed: its bytes read and written per device.
        collectives: rows ``{"axes": tuple, "count": executions, "sent_bytes": bytes}``
            (``CommsReport.per_axis()``).
        mesh_axes: ``[(name, size)]`` in mesh order (None or [] for one device).
        spec: the ``DeviceSpec``.
        op_time: the step's ``OpTime`` (or its dict) where the device that compiled it has
            measured rates: then the device's work is that, not the roofline's bound.
    """
    times = {}
    for row in collectives:
        axes = tuple(row["axes"] or ())
        if not axes:
            continue  # a collective over one device moves nothing
        seconds = row["count"] * spec.collective_latency_s + row["sent_bytes"] / axes_bandwidth(
            axes, mesh_axes or [], spec
        )
        key = ",".join(axes)
        times[key] = times.get(key, 0.0) + seconds
    if isinstance(op_time, dict):
        op_time = OpTime(**{**op_time, "unknown_kernels": tuple(op_time["unknown_kernels"])})
    return StepTime(
        compute_s=flops / spec.peak_flops,
        memory_s=bytes_accessed / spec.hbm_bandwidth,
        collective_s=times,
        ops_s=None if op_time is None else op_time.step_s,
    )


def mfu(model_flops, step_s, devices, spec):
    """Model FLOPs utilisation of a step of ``step_s`` seconds on ``devices`` devices."""
    if not model_flops or step_s <= 0:
        return None
    return model_flops / (step_s * devices * spec.peak_flops)


# --- a step's time op by op, at the rates a device was measured to reach ---------------


@dataclasses.dataclass(frozen=True)
class OpRates:
    """What one device's ops were measured to reach (its profiler's trace of real steps):
    matmul FLOP/s and HBM bytes/s of the ops XLA compiles, the gap the device leaves
    between two ops, and a Pallas kernel's seconds per attention score it visits (forward
    and backward, by the kernel's name)."""

    matmul_flops: float
    bandwidth: float
    op_gap_s: float
    kernel_score_s: tuple  # ((name prefix, seconds per visited score), ...)
    source: str  # where the figures were measured (docs/planning.md)


# Measured on one TPU v5e chip (JAX 0.10.2, libtpu of that release): the profiler's trace
# of gpt_1b at 8 layers (batch 2 x 2,048), gpt_350m (8 x 1,024) and llama_3_2_1b's LoRA
# (4 x 2,048), 3 steps each, read against the optimised HLO of each step
# (recipes/tpu-v5e-1/issue43_rows.sh 29; docs/planning.md, "The step's time op by op").
MEASURED_RATES = {
    "tpu-v5e": OpRates(
        matmul_flops=175e12,
        bandwidth=800e9,
        op_gap_s=4e-6,
        kernel_score_s=(("splash_mqa_fwd", 4.17e-12), ("splash_mqa_dkv", 7.5e-12), ("splash_mqa_dq", 3.5e-12)),
        source="TPU v5e, JAX 0.10.2: issue43_rows.sh part 29's traces",
    ),
}


@dataclasses.dataclass(frozen=True)
class OpTime:
    """Seconds per step by kind of op (``op_step_time``)."""

    matmul_s: float
    memory_s: float
    kernel_s: float
    gaps_s: float
    ops: int  # ops run per step
    unknown_kernels: tuple = ()  # custom calls no rate covers (counted by their bytes)

    @property
    def step_s(self):
        return self.matmul_s + self.memory_s + self.kernel_s + self.gaps_s


def kernel_scores(op):
    """Attention scores a splash-style kernel call visits: its query heads x T x S, times the
    share of (query block, key block) pairs its block mask does not skip
    (``HloOp.block_fraction``; all where it has none). The queries are its operand of the
    highest rank ([..., G, T, D], or [..., G, D, T] where the kernel reads (D, T) blocks), the
    keys the first after it one rank lower sharing a last-two dimension with it ([..., S, D]
    or [..., D, S]); the head dim D is the shared size (the smaller where two are shared,
    T = S). None where its operands hold no such pair."""
    ranked = [dims for _, dims in op.operands if len(dims) >= 3]
    if not ranked:
        return None
    queries = max(ranked, key=len)
    start = next(i for i, (_, dims) in enumerate(op.operands) if dims == queries)
    for _, keys in op.operands[start + 1 :]:
        shared = set(queries[-2:]) & set(keys[-2:]) if len(keys) == len(queries) - 1 else set()
        if shared:
            head_dim = min(shared)
            q_len, kv_len = math.prod(queries[-2:]) // head_dim, math.prod(keys[-2:]) // head_dim
            visited = op.block_fraction if op.block_fraction is not None else 1.0
            return math.prod(queries[:-2]) * q_len * kv_len * visited
    return None


def op_step_time(ops, rates):
    """``OpTime`` of ``ops`` (``zoo.measure.hlo_ops.executed_ops``) at ``rates``: each op at
    its own bound, ``max(FLOPs / matmul rate, bytes / bandwidth)``, a kernel at its rate per
    visited score, plus the gap the device leaves after each op; the asynchronous copies run
    beside the compute and cost nothing here."""
    times = {"matmul": 0.0, "memory": 0.0, "kernel": 0.0}
    count, unknown = 0, set()
    for op in ops:
        if op.kind in ("async", "collective"):
            continue  # copies beside the compute; collectives are the roofline's own term
        count += op.runs
        if op.kind == "kernel":
            rate = next((seconds for prefix, seconds in rates.kernel_score_s if op.name.startswith(prefix)), None)
            scores = kernel_scores(op) if rate else None
            if scores is not None:
                times["kernel"] += scores * rate * op.runs
                continue
            unknown.add(op.name.rsplit(".", 1)[0])
        times[op.kind] += max(op.flops / rates.matmul_flops, op.bytes / rates.bandwidth) * op.runs
    return OpTime(
        times["matmul"], times["memory"], times["kernel"], count * rates.op_gap_s, count, tuple(sorted(unknown))
    )
