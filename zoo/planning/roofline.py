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
"""

import dataclasses
import math

import numpy as np

__all__ = ["MEASURED_STEPS", "StepTime", "axes_bandwidth", "estimate_step_time", "measured_error", "mfu"]

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


def measured_error(spec):
    """``(lowest, highest, rows)``: the planned step over the measured one across
    ``MEASURED_STEPS`` for ``spec``'s device, or None where none was measured."""
    rows = MEASURED_STEPS.get(spec.name)
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

    @property
    def communication_s(self):
        return sum(self.collective_s.values())

    @property
    def step_s(self):
        """No overlap of communication with compute: the estimate the plan ranks by."""
        return max(self.compute_s, self.memory_s) + self.communication_s

    @property
    def overlapped_s(self):
        return max(self.compute_s, self.memory_s, self.communication_s)

    @property
    def bound(self):
        """What limits the step: compute, memory or communication."""
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


def estimate_step_time(*, flops, bytes_accessed, collectives, mesh_axes, spec):
    """``StepTime`` of one device.

    Args:
        flops: the compiled program's FLOPs per device (loops counted by trip count).
        bytes_accessed: its bytes read and written per device.
        collectives: rows ``{"axes": tuple, "count": executions, "sent_bytes": bytes}``
            (``CommsReport.per_axis()``).
        mesh_axes: ``[(name, size)]`` in mesh order (None or [] for one device).
        spec: the ``DeviceSpec``.
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
    return StepTime(compute_s=flops / spec.peak_flops, memory_s=bytes_accessed / spec.hbm_bandwidth, collective_s=times)


def mfu(model_flops, step_s, devices, spec):
    """Model FLOPs utilisation of a step of ``step_s`` seconds on ``devices`` devices."""
    if not model_flops or step_s <= 0:
        return None
    return model_flops / (step_s * devices * spec.peak_flops)
