"""A ``Plan`` as text: the table ``zoo plan`` prints, and the one-line verdict when it does not fit."""

from zoo.config.layouts import LAYOUT_TABLE
from zoo.planning.roofline import axes_bandwidth, measured_error
from zoo.units import format_bytes

__all__ = ["advice", "format_plan", "largest_part", "size_text", "verdict"]


def size_text(count):
    """Bytes in the largest unit that keeps the number >= 1 (GiB at most), as the plan's
    tables write them: two decimals, thousands grouped (``"1,000.00 MiB"``)."""
    return format_bytes(count, 2, grouping=True)


def _flops_text(flops):
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= size:
            return f"{flops / size:,.1f} {unit}"
    return f"{flops / 1e6:,.1f} MFLOP"


def _ms(seconds):
    return f"{seconds * 1e3:,.1f} ms"


def format_plan(plan):
    """The plan as text lines: what was compiled, memory per device, collectives, time."""
    request, step, spec = plan.request, plan.step, plan.spec
    depth = (
        "whole model"
        if len(plan.compiled_depths) < 2
        else f"extrapolated from {plan.compiled_depths[0]} and {plan.compiled_depths[1]} blocks"
    )
    lines = [
        f"plan: {request.label or request.job} on {request.devices} x {spec.name} ({spec.description})",
        f"compiled: the fit step on {step.mesh or 'one device'}, global batch {step.batch_size}, "
        f"{plan.full_depth or '-'} blocks ({depth}), {step.compile_s:.1f} s to compile",
        "| per device | bytes |",
        "| --- | ---: |",
    ]
    lines += [f"| {part} | {size_text(count)} |" for part, count in plan.parts().items()]
    lines.append(f"| **peak** (of {size_text(plan.device_memory)}) | **{size_text(plan.peak)}** |")
    if plan.step.memory.get("host"):
        lines.append(f"| optimizer state in host memory (not in the peak) | {size_text(plan.step.memory['host'])} |")
    lines += _collective_lines(plan)
    time = plan.time
    if plan.step.op_time is not None:
        lines.append(_op_time_line(plan.step.op_time, spec, time))
    else:
        lines.append(
            f"time per step (roofline, {spec.name}): compute {_ms(time.compute_s)}, memory {_ms(time.memory_s)}, "
            f"communication {_ms(time.communication_s)} -> {_ms(time.step_s)} ({_ms(time.overlapped_s)} if "
            f"communication overlaps compute); {time.bound}-bound"
        )
    if error := measured_error(spec, by_ops=plan.step.op_time is not None):
        low, high, rows = error
        what = "this op-by-op time" if plan.step.op_time is not None else "the roofline's step"
        lines.append(
            f"measured against {spec.name}: {what} was {low:.2f}x-{high:.2f}x the measured step over "
            f"{rows} steps (docs/planning.md, known errors): read it as a range, not a prediction"
        )
    if plan.mfu is not None:
        lines.append(f"estimated MFU: {100 * plan.mfu:.1f}% ({_flops_text(plan.model_flops)} of model FLOPs per step)")
    lines += [f"note: {note}" for note in plan.notes]
    lines.append(verdict(plan))
    return lines


def _op_time_line(op_time, spec, time):
    """The step's ops at the rates ``spec``'s device was measured to reach (``roofline.OpTime``)."""
    unknown = op_time["unknown_kernels"]
    return (
        f"time per step (its {op_time['ops']:,} ops at {spec.name}'s measured rates): matmuls "
        f"{_ms(op_time['matmul_s'])}, memory-bound ops {_ms(op_time['memory_s'])}, kernels {_ms(op_time['kernel_s'])}, "
        f"gaps between ops {_ms(op_time['gaps_s'])}, communication {_ms(time.communication_s)} -> {_ms(time.step_s)}"
        + (f" (kernels without a measured rate, by their bytes: {', '.join(unknown)})" if unknown else "")
    )


def _collective_lines(plan):
    rows = [row for row in plan.step.collectives if row["axes"]]
    if not rows:
        return ["collectives: none"]
    mesh_axes = plan.step.mesh_axes
    lines = ["| mesh axes | collective | per step | sent per device | link |", "| --- | --- | ---: | ---: | --- |"]
    for row in sorted(rows, key=lambda r: (r["axes"], r["kind"])):
        bandwidth = axes_bandwidth(row["axes"], mesh_axes, plan.spec)
        lines.append(
            f"| {','.join(row['axes'])} | {row['kind']} | {row['count']:,.0f} | {size_text(row['sent_bytes'])} | {bandwidth / 1e9:,.0f} GB/s |"
        )
    if not plan.step.collectives_exact:
        lines.append("(a loop without a known trip count was counted once: the counts are a lower bound)")
    return lines


def largest_part(plan):
    parts = plan.parts()
    return max(parts, key=parts.get)


def batch_shards(plan):
    """How many pieces the plan's layout cuts the batch into (1 where the layout is not the table's)."""
    record = LAYOUT_TABLE.get(plan.request.config.get("layout"))
    return record.batch_split(plan.step.axis_sizes) if record is not None else 1


def _context_takes(config):
    """Whether layout context could run this job: a sequence to split."""
    return "sequence_length" in config


def advice(plan):
    """The change that would help most, for the largest part of the peak."""
    config = plan.request.config
    part, layout = largest_part(plan), config.get("layout")
    if part == "activations and workspace":
        if config.get("remat") == "none":
            return "rematerialise the blocks (remat full)"
        batch = config.get("batch_size", 1)
        if (batch // 2) % batch_shards(plan) == 0 and batch % 2 == 0:  # half the batch still splits evenly
            if "gradient_accumulation_steps" in config:
                return f"halve the batch per step ({batch // 2}, with {2 * config['gradient_accumulation_steps']} accumulation steps per update)"
            return f"halve the batch per step ({batch // 2})"
        return "split the sequence over devices (layout context)" if _context_takes(config) else "use more devices"
    if layout in LAYOUT_TABLE and LAYOUT_TABLE[layout].gradients_all_reduced:  # whole weights on every replica
        return "split weights, gradients and optimizer state over the data axis (layout fsdp, or fsdp+tp)"
    return "use more devices, or a smaller model"


def verdict(plan):
    """One line: fits, or does not and why (largest part, the change that would help most);
    where this JAX cannot show remat, or XLA:CPU compiled a TPU's step, what the peak then
    is (``Plan.caveat``)."""
    caveat = f" ({plan.caveat})" if plan.caveat else ""
    if plan.fits:
        share = 100 * plan.peak / plan.device_memory
        return f"fits: peak {size_text(plan.peak)} of {size_text(plan.device_memory)} per device ({share:.0f}%){caveat}"
    part = largest_part(plan)
    auto = ", or let zoo plan --auto choose" if plan.request.job == "pretrain_gpt" else ""
    return (
        f"does not fit: peak {size_text(plan.peak)} > {size_text(plan.device_memory)} per device{caveat}; largest "
        f"part {part} {size_text(plan.parts()[part])}; {advice(plan)}{auto}"
    )
