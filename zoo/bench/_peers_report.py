"""``zoo bench peers``' tables: the memory, bytes and FLOPs of each side's compiled step, and
the step times side by side (``zoo.bench.peers`` measures the rows)."""

from zoo.bench._output import size_text

__all__ = [
    "AXIS_COLUMNS",
    "MEMORY_CONFIG",
    "MEMORY_LENGTH",
    "TIMING_BATCH",
    "format_memory_row",
    "format_memory_table",
    "format_time_row",
    "format_time_table",
]

AXIS_COLUMNS = ("data", "model", "data,model")
MEMORY_CONFIG = "llama_3_2_1b"  # the zoo's named config of the memory table
MEMORY_LENGTH = 2048  # T of the memory table
TIMING_BATCH = 8  # the timing model's global batch


def format_memory_row(row):
    sent = " | ".join(size_text(row["sent"][axis]) if row["sent"].get(axis) else "-" for axis in AXIS_COLUMNS)
    return (
        f"| {row['layout']} | {row['per_device_batch']} | {row['side']} | {row['mesh']} | {row['parameters']:,} | "
        f"{size_text(row['argument'])} | {size_text(row['temp'])} | {size_text(row['peak'])} | {sent} | "
        f"{row['flops'] / 1e12:.2f} | {row['compile_s']:.0f} |"
    )


def format_memory_table(rows):
    lines = [
        f"Memory, bytes and FLOPs per device: Llama-3.2-1B (the zoo's {MEMORY_CONFIG}: 16 blocks, C=2,048, 32/8 heads "
        f"of 64, F=8,192, V=128,256 tied), T={MEMORY_LENGTH:,}, global batch 8 b, compiled, never run. Arguments = "
        "weights + optimizer state + batch; peak = arguments + outputs - aliased + temporaries (memory_analysis); "
        "sent = bytes one device sends per step over the axis (ring algorithms, loop trip counts included, both "
        "HLOs read by zoo.measure.hlo); TFLOP = cost_analysis + loop-body dots beyond their first trip. "
        + _versions(rows),
        "",
        "| layout | b | side | mesh | parameters | arguments | temporaries | peak | sent: data | sent: model | "
        "sent: data,model | TFLOP | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [format_memory_row(row) for row in rows]
    lines += ["", "Peak zoo / MaxText: " + "; ".join(_peak_ratios(rows))]
    notes = dict.fromkeys(note for row in rows for note in row.get("notes", ()))  # in order, once each
    lines += [f"zoo note: {note}" for note in notes]
    return "\n".join(lines)


def _versions(rows):
    """``"JAX: zoo 0.12.0.1, MaxText 0.12.0.1."``"""
    versions = {}
    for row in rows:
        versions.setdefault(row["side"].split()[0], row["jax"])
    return "JAX: " + ", ".join(f"{side} {version}" for side, version in versions.items()) + "."


def _peak_ratios(rows):
    zoo = {(r["layout"], r["per_device_batch"]): r["peak"] for r in rows if r["side"] == "zoo"}
    return [
        f"{r['layout']} b={r['per_device_batch']} {zoo[(r['layout'], r['per_device_batch'])] / r['peak']:.2f}"
        + ("" if r["side"] == "MaxText" else f" (vs {r['side'].removeprefix('MaxText ')})")
        for r in rows
        if r["side"] != "zoo" and (r["layout"], r["per_device_batch"]) in zoo
    ]


def format_time_row(row):
    return (
        f"| {row['layout']} | {row['parameters']:,} | {row['zoo_wall']:.2f} | {row['maxtext_wall']:.2f} | "
        f"**{row['wall_ratio']:.2f}** | {row['zoo_cpu']:.2f} | {row['maxtext_cpu']:.2f} | **{row['cpu_ratio']:.2f}** |"
    )


def format_time_table(settings, rows):
    lines = [
        "Step time, the timing model: C=512, 4 blocks, 8/4 heads of 64, F=2,048, V=32,000 tied, T=512, global "
        f"batch {TIMING_BATCH}; each side's real step (zoo: model.fit; MaxText: train_step on its synthetic batch), "
        f"{settings.steps} steps per run, runs interleaved zoo, MaxText x {settings.repeats}; seconds per step, "
        "medians; ratio = zoo / MaxText (CPU: process CPU time, all threads).",
        "",
        "| layout | parameters | zoo wall s | MaxText wall s | wall zoo/MaxText | zoo CPU s | MaxText CPU s | "
        "CPU zoo/MaxText |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + [format_time_row(row) for row in rows])
