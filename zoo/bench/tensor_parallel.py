"""``zoo bench tp``: what the explicit tensor-parallel MLP communicates, against GSPMD and the minimum.

For each MLP variant (plain or gated; Megatron TP or sequence-parallel) the same
maths is compiled three ways on the same mesh and the forward + backward program
(output and gradients of every weight and of the input) is read with
``zoo.measure.comms_report``:

- **explicit**: ``zoo.layers.ParallelMLP``, ``shard_map``s with the collectives
  written out (sequence-parallel also with ``collective_matmul``, the ring version);
- **GSPMD**: plain ``keras.layers.Dense`` layers under ``ModelParallel`` with a layout
  map (kernels split as Megatron splits them; in sequence-parallel mode also the
  activations' layouts), partitioned by XLA;
- **minimum**: Megatron's bound, computed: forward one all-reduce of the (B/dp, T, C)
  output per device, backward one of d(input), i.e. 2 x 2 (N-1)/N x B/dp T C x 4
  bytes sent per device; sequence-parallel moves the same bytes as all-gathers and
  reduce-scatters.

Per variant the table gives the model-axis collectives and the bytes each device sends
over the model axis, their ratio to the minimum, the data-axis traffic (weight
gradients), per-device peak memory (arguments + outputs + temporaries, from
``memory_analysis``), and the CPU time of a forward + backward relative to GSPMD,
both timed alternately in the same run (median of ``repeats``). No biases: the bound
concerns activations; bias gradients would add a few D-sized sums.
"""

import statistics
import time

import jax
import keras

from zoo import distribution as zd
from zoo.bench._output import publish
from zoo.config.bench_settings import TPBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution.axes import DATA, MODEL
from zoo.measure.comms_report import FAST_COMPILE, comms_report, layer_step
from zoo.measure.tensor_parallel_mlp import (
    SEED,
    VARIANTS,
    check_settings,
    example_input,
    explicit_model,
    gspmd_model,
    minimum_sent_bytes,
)
from zoo.units import KIB, format_bytes_in


def run_benchmark(settings, report=print):
    """Compile and time every variant; report the markdown table; return one dict per row
    (``settings``: ``zoo.config.bench_settings.TPBenchSettings``; ``settings.plot``: also the chart)."""
    check_settings(settings)
    rows = []
    try:
        for label, gated, megatron_sp in (VARIANTS[name] for name in settings.variants):
            report(f"{label}: compiling ...")
            rows += bench_variant(label, gated, megatron_sp, settings)
    finally:
        keras.distribution.set_distribution(None)
    table = format_table(rows, settings)
    publish(table, settings, report)
    if settings.plot:
        from zoo.plotting import plot_tp_bytes

        plot_tp_bytes(
            rows,
            settings.plot,
            title=f"Tensor-parallel MLP, forward + backward, mesh {settings.mesh}: bytes per device over 'model'",
        )
    return rows


def bench_variant(label, gated, megatron_sp, settings):
    """Rows for one variant: explicit (and collective), GSPMD, minimum."""
    implementations = [("explicit", lambda: explicit_model(settings, gated, megatron_sp))]
    if megatron_sp:
        implementations.append(
            ("explicit, collective matmul", lambda: explicit_model(settings, gated, True, collective=True))
        )
    implementations.append(("GSPMD", lambda: gspmd_model(settings, gated, megatron_sp)))
    steps = {}
    rows = []
    for name, make in implementations:
        keras.utils.set_random_seed(SEED)
        distribution, model = make()
        step, args = layer_step(model, example_input(settings, megatron_sp), backward=True)
        options = FAST_COMPILE if settings.fast_compile else None
        report = comms_report(step, *args, mesh=distribution.device_mesh, compiler_options=options)
        steps[name] = (report.compiled, args)
        rows.append(_row(label, name, report, settings))
    times = _alternate_times(steps, settings)
    for row in rows:
        row["time_vs_gspmd"] = times[row["implementation"]] / times["GSPMD"]
        row["seconds_per_step"] = times[row["implementation"]]
    minimum = minimum_sent_bytes(settings)
    rows.append(
        {
            "variant": label,
            "implementation": "minimum (Megatron)",
            "model_collectives": "2 all-reduce" if not megatron_sp else "2 all-gather + 2 reduce-scatter",
            "model_sent_bytes": minimum,
            "vs_minimum": 1.0,
            "data_sent_bytes": None,
            "peak_bytes": None,
            "time_vs_gspmd": None,
        }
    )
    return rows


def _row(label, implementation, report, settings):
    model_ops = [op for op in report.collectives if MODEL in (op.axes or ())]
    kinds = {}
    for op in model_ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + op.buffers
    sent = sum(op.sent_bytes for op in model_ops)
    return {
        "variant": label,
        "implementation": implementation,
        "model_collectives": " + ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none",
        "model_sent_bytes": sent,
        "vs_minimum": sent / minimum_sent_bytes(settings),
        "data_sent_bytes": sum(op.sent_bytes for op in report.collectives if op.axes == (DATA,)),
        "peak_bytes": report.memory.peak_bytes,
        "report": report,
    }


def _alternate_times(steps, settings):
    """Median seconds per forward + backward of each step, measured in turns."""
    runs = {name: [] for name in steps}
    for step, args in steps.values():  # warm up
        jax.block_until_ready(step(*args))
    for _ in range(settings.repeats):
        for name, (step, args) in steps.items():
            start = time.perf_counter()
            for _ in range(settings.steps):
                # one sharded program in flight at a time: XLA:CPU collectives can
                # deadlock with several queued (docs/distribution.md)
                jax.block_until_ready(step(*args))
            runs[name].append((time.perf_counter() - start) / settings.steps)
    return {name: statistics.median(values) for name, values in runs.items()}


def _kib(count):
    return format_bytes_in(count, KIB, 1, grouping=True)


def format_table(rows, settings):
    """A header line and a markdown table, one row per (variant, implementation)."""
    header = (
        f"devices: {zd.describe_devices()}; mesh {settings.mesh}; B={settings.batch_size} T={settings.sequence_length} "
        f"D={settings.dim} F={settings.hidden}, float32, no biases; forward + backward; time: median of "
        f"{settings.repeats} x {settings.steps} steps; jax {jax.__version__}, keras {keras.__version__}"
    )
    lines = [
        header,
        "",
        (
            "| layer | implementation | model-axis collectives | sent over model (KiB/device) | vs minimum | "
            "sent over data (KiB/device) | peak memory (KiB/device) | time vs GSPMD |"
        ),
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        time_ratio = "-" if row["time_vs_gspmd"] is None else f"{row['time_vs_gspmd']:.2f}"
        lines.append(
            f"| {row['variant']} | {row['implementation']} | {row['model_collectives']} | {_kib(row['model_sent_bytes'])} | "
            f"{row['vs_minimum']:.2f} | {_kib(row['data_sent_bytes'])} | {_kib(row['peak_bytes'])} | {time_ratio} |"
        )
    return "\n".join(lines)
