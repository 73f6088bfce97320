"""``zoo bench tp``: what the explicit tensor-parallel MLP communicates, against GSPMD and the minimum.

For each MLP variant (plain or gated; Megatron TP or sequence-parallel) the same
maths is compiled three ways on the same mesh and the forward + backward program
(output and gradients of every weight and of the input) is read with
``zoo.distribution.comms_report``:

- **explicit**: ``zoo.layers.ParallelMLP``, ``shard_map``s with the collectives
  written out (sequence-parallel also with ``collective_matmul``, the ring version);
- **GSPMD**: plain ``keras.layers.Dense`` layers under ``ModelParallel`` with a layout
  map (kernels split as Megatron splits them; in sequence-parallel mode also the
  activations' layouts), partitioned by XLA;
- **minimum**: Megatron's bound, computed: forward one all-reduce of the (B/dp, T, D)
  output per device, backward one of d(input), i.e. 2 x 2 (M-1)/M x B/dp T D x 4
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
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zoo import distribution as zd
from zoo.bench._output import write_text
from zoo.config.bench_settings import TP_VARIANTS, TPBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution.axes import DATA, MODEL
from zoo.distribution.comms_report import FAST_COMPILE, comms_report, layer_step
from zoo.distribution.mesh import require_axes
from zoo.layers.parallel_mlp import ParallelMLP
from zoo.units import KIB

# name (TP_VARIANTS) -> (label, gated, megatron_sp): the groups of rows of the table, in order.
VARIANTS = {
    "mlp": ("MLP", False, False),
    "gated": ("gated MLP", True, False),
    "sp": ("MLP, sequence-parallel", False, True),
    "gated-sp": ("gated MLP, sequence-parallel", True, True),
}
assert tuple(VARIANTS) == TP_VARIANTS
SEED = 0


def run_benchmark(config, report=print):
    """Compile and time every variant; report the markdown table; return one dict per row
    (``config``: ``zoo.config.bench_settings.TPBenchSettings``; ``config.plot``: also the chart)."""
    check_config(config)
    rows = []
    try:
        for label, gated, megatron_sp in (VARIANTS[name] for name in config.variants):
            report(f"{label}: compiling ...")
            rows += bench_variant(label, gated, megatron_sp, config)
    finally:
        keras.distribution.set_distribution(None)
    table = format_table(rows, config)
    report(table)
    if config.output:
        write_text(config.output, table)
    if config.plot:
        from zoo.plotting import plot_tp_bytes

        plot_tp_bytes(
            rows,
            config.plot,
            title=f"Tensor-parallel MLP, forward + backward, mesh {config.mesh}: bytes per device over 'model'",
        )
    return rows


def check_config(config):
    for name in ("batch_size", "sequence_length", "dim", "hidden", "steps", "repeats"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    unknown = [name for name in config.variants if name not in VARIANTS]
    if unknown or not config.variants:
        raise ValueError(f"variants must be some of {list(VARIANTS)}, got {list(config.variants)}")
    mesh = zd.make_mesh(config.mesh)
    require_axes(mesh, (DATA, MODEL), "zoo bench tp")
    data, model = zd.mesh_axis_size(mesh, DATA), zd.mesh_axis_size(mesh, MODEL)
    for what, size, axis, count in (
        ("batch size", config.batch_size, DATA, data),
        ("sequence length", config.sequence_length, MODEL, model),
        ("hidden", config.hidden, MODEL, model),
    ):
        if size % count:
            raise ValueError(f"{what} {size} is not divisible by the {axis!r} mesh axis of size {count}")


def minimum_sent_bytes(config, dtype_bytes=4):
    """Megatron's bound for one MLP forward + backward: bytes each device sends over the model axis."""
    mesh = zd.make_mesh(config.mesh)
    data, model = zd.mesh_axis_size(mesh, DATA), zd.mesh_axis_size(mesh, MODEL)
    activation = config.batch_size // data * config.sequence_length * config.dim * dtype_bytes  # (B/dp, T, D)
    return 2 * 2 * (model - 1) / model * activation  # two all-reduces (or 2 AG + 2 RS)


def explicit_model(config, gated, megatron_sp, collective=False):
    """(distribution, model) with ``ParallelMLP``; the layers place their own weights."""
    mesh = zd.make_mesh(config.mesh)
    distribution = zd.CheckedModelParallel(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name=DATA)
    mlp = ParallelMLP(
        config.hidden,
        activation="gelu",
        gated=gated,
        use_bias=False,
        megatron_sp=megatron_sp,
        collective_matmul=collective,
        name="mlp",
    )
    return distribution, zd.build_distributed(lambda: _functional(config, mlp), distribution)


def gspmd_model(config, gated, megatron_sp):
    """(distribution, model): plain Dense layers, placed by a layout map, partitioned by GSPMD.

    Layout rules (D = dim, F = hidden):

    ===============  ==========  ================  =========================
    path             shape       layout            when
    ===============  ==========  ================  =========================
    gate/kernel      (D, F)      (-, model)        gated
    up/kernel        (D, F)      (-, model)        always
    down/kernel      (F, D)      (model, -)        always
    gate/output      (B, T, F)   (data, -, model)  gated, sequence-parallel
    up/output        (B, T, F)   (data, -, model)  sequence-parallel
    down/output      (B, T, D)   (data, model, -)  sequence-parallel
    ===============  ==========  ================  =========================
    """
    mesh = zd.make_mesh(config.mesh)
    layout_map = keras.distribution.LayoutMap(mesh)
    names = ("gate", "up") if gated else ("up",)
    for name in names:
        layout_map[f".*{name}/kernel"] = (None, MODEL)
        if megatron_sp:
            layout_map[f".*{name}/output"] = (DATA, None, MODEL)
    layout_map[".*down/kernel"] = (MODEL, None)
    if megatron_sp:
        layout_map[".*down/output"] = (DATA, MODEL, None)
    distribution = zd.CheckedModelParallel(layout_map=layout_map, batch_dim_name=DATA)

    def build():
        x = keras.Input((config.sequence_length, config.dim), name="x")  # (B, T, D)
        dense = lambda units, name, activation=None: keras.layers.Dense(
            units, activation=activation, use_bias=False, name=name
        )
        up = dense(config.hidden, "up", None if gated else "gelu")(x)  # (B, T, F)
        h = keras.layers.Multiply(name="glu")([dense(config.hidden, "gate", "gelu")(x), up]) if gated else up
        return keras.Model(x, dense(config.dim, "down")(h), name="gspmd_mlp")  # (B, T, D)

    model = build_checked(build, distribution)
    return distribution, model


def build_checked(build, distribution):
    """``build_distributed``, minus its check that every rule matched a *variable*:
    output-layout rules match layer outputs, which that check does not see."""
    keras.distribution.set_distribution(distribution)
    return build()


def _functional(config, layer):
    x = keras.Input((config.sequence_length, config.dim), name="x")  # (B, T, D)
    return keras.Model(x, layer(x), name="explicit_mlp")


def example_input(config, megatron_sp):
    """x (B, T, D) placed as the layer before the MLP would leave it: batch over data,
    and the sequence over model in sequence-parallel mode."""
    distribution = keras.distribution.distribution()
    x = (
        np.random.default_rng(SEED)
        .standard_normal((config.batch_size, config.sequence_length, config.dim))
        .astype("float32")
    )
    spec = P(DATA, MODEL, None) if megatron_sp else P(DATA, None, None)
    return jax.device_put(x, NamedSharding(distribution.device_mesh.backend_mesh, spec))


def bench_variant(label, gated, megatron_sp, config):
    """Rows for one variant: explicit (and collective), GSPMD, minimum."""
    implementations = [("explicit", lambda: explicit_model(config, gated, megatron_sp))]
    if megatron_sp:
        implementations.append(
            ("explicit, collective matmul", lambda: explicit_model(config, gated, True, collective=True))
        )
    implementations.append(("GSPMD", lambda: gspmd_model(config, gated, megatron_sp)))
    steps = {}
    rows = []
    for name, make in implementations:
        keras.utils.set_random_seed(SEED)
        distribution, model = make()
        step, args = layer_step(model, example_input(config, megatron_sp), backward=True)
        options = FAST_COMPILE if config.fast_compile else None
        report = comms_report(step, *args, mesh=distribution.device_mesh, compiler_options=options)
        steps[name] = (report.compiled, args)
        rows.append(_row(label, name, report, config))
    times = _alternate_times(steps, config)
    for row in rows:
        row["time_vs_gspmd"] = times[row["implementation"]] / times["GSPMD"]
        row["seconds_per_step"] = times[row["implementation"]]
    minimum = minimum_sent_bytes(config)
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


def _row(label, implementation, report, config):
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
        "vs_minimum": sent / minimum_sent_bytes(config),
        "data_sent_bytes": sum(op.sent_bytes for op in report.collectives if op.axes == (DATA,)),
        "peak_bytes": report.memory.peak_bytes,
        "report": report,
    }


def _alternate_times(steps, config):
    """Median seconds per forward + backward of each step, measured in turns."""
    runs = {name: [] for name in steps}
    for step, args in steps.values():  # warm up
        jax.block_until_ready(step(*args))
    for _ in range(config.repeats):
        for name, (step, args) in steps.items():
            start = time.perf_counter()
            for _ in range(config.steps):
                # one sharded program in flight at a time: XLA:CPU collectives can
                # deadlock with several queued (docs/distribution.md)
                jax.block_until_ready(step(*args))
            runs[name].append((time.perf_counter() - start) / config.steps)
    return {name: statistics.median(values) for name, values in runs.items()}


def _kib(count):
    return "-" if count is None else f"{count / KIB:,.1f}"


def format_table(rows, config):
    """A header line and a markdown table, one row per (variant, implementation)."""
    header = (
        f"devices: {zd.describe_devices()}; mesh {config.mesh}; B={config.batch_size} T={config.sequence_length} "
        f"D={config.dim} F={config.hidden}, float32, no biases; forward + backward; time: median of "
        f"{config.repeats} x {config.steps} steps; jax {jax.__version__}, keras {keras.__version__}"
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
