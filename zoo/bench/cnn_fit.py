"""``zoo bench cnn``: images/s of ``model.fit`` against a hand-written ``jax.jit`` step.

For each layout (one device, ``DataParallel``, ``ModelParallel``) the small CNN is
trained two ways on the same mesh, from the same host numpy arrays:

(a) ``model.fit`` for one epoch of ``steps`` batches (``shuffle=False``, ``verbose=0``);
(b) a loop over a ``jax.jit`` train step written by hand from Keras' stateless API
    (``stateless_call`` + compiled loss + ``jax.value_and_grad`` +
    ``optimizer.stateless_apply``), the state donated, each batch placed from host
    numpy with ``jax.device_put`` on the distribution's data sharding. The next batch
    is copied while a step runs, but each step is awaited before the next is
    dispatched (XLA:CPU collectives can deadlock otherwise, see ``_await``); if
    anything this handicaps the hand-written loop, whose Python dispatch no longer
    overlaps compute, so it cannot flatter the ratio against fit.

Both are compiled before timing and the clock stops only once results are ready
(``jax.block_until_ready``). The runs alternate ``repeats`` times and the median of
each is kept; the number that matters is the ratio fit / jit, measured side by side
in the same process (absolute images/s on a shared CPU are noise).

Before timing, one hand-written step and one ``fit`` step from the same weights must
give the same loss, so the two loops provably do the same maths.
"""

import jax
import keras

from zoo import distribution as zd
from zoo.bench._fit_vs_jit import (  # noqa: F401  (re-exported: the benchmark's building blocks)
    LOSS_ATOL,
    LOSS_RTOL,
    SameMathsError,
    check_same_maths,
    compare_losses,
    data_shardings,
    fit_rate,
    jit_rate,
    make_jit_step,
    measure,
    mesh_name,
)
from zoo.bench._output import publish
from zoo.config.bench_settings import CNNBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.data import load_shapes
from zoo.models import SmallCNN
from zoo.training.cnn import build_cnn, compile_cnn

# (label, layout): the mesh is each layout's default, "data=<all devices>" for
# "data" and "data=2,model=<rest>" for "model" (see zoo.distribution.distribution_for).
LAYOUTS = (("single device", "single"), ("DataParallel", "data"), ("ModelParallel", "model"))

SEED = 0  # data, weights and dropout stream; fixed so runs are comparable


def run_benchmark(settings, report=print):
    """Measure every layout of ``settings`` (``zoo.config.bench_settings.CNNBenchSettings``),
    report the markdown table, return one dict per layout."""
    _check_settings(settings)
    x, y = load_shapes(
        "train", image_size=settings.image_size, num_examples=settings.steps * settings.batch_size, seed=SEED
    )
    rows = []
    try:
        for label, distribution in make_layouts(settings.batch_size):
            rows.append(bench_layout(label, distribution, x, y, settings, report))
    finally:
        keras.distribution.set_distribution(None)
    table = format_table(rows, settings)
    publish(table, settings, report)
    return rows


def _check_settings(settings):
    for name in ("image_size", "batch_size", "steps", "repeats"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def make_layouts(batch_size):
    """``[(label, distribution or None)]`` in table order; checks the batch splits evenly."""
    layouts = [(label, zd.distribution_for(SmallCNN, layout)) for label, layout in LAYOUTS]  # None for "single"
    for label, distribution in layouts:
        replicas = zd.data_parallel_size(distribution)
        if batch_size % replicas:
            raise ValueError(
                f"batch size {batch_size} is not divisible by the data axis of size {replicas} "
                f"of the {label} mesh {mesh_name(distribution)}"
            )
    return layouts


def bench_layout(label, distribution, x, y, settings, report=print):
    """One table row: median fit and jit images/s under ``distribution`` (None: one device).

    x: f32[N, S, S, 3] host images, y: i32[N] labels, N = steps * batch_size.
    """

    def build_model():
        model = build_cnn(settings.image_size, SEED)
        compile_cnn(model)
        return model

    row = measure(
        label,
        distribution,
        build_model,
        x,
        y,
        batch_size=settings.batch_size,
        repeats=settings.repeats,
        seed=SEED,
        unit="images",
        report=report,
    )
    row["fit_images_per_s"], row["jit_images_per_s"] = row.pop("fit_per_s"), row.pop("jit_per_s")
    return row


def format_table(rows, settings):
    """A header line and a markdown table, one row per layout."""
    header = (
        f"devices: {zd.describe_devices()}; image size {settings.image_size}, batch size "
        f"{settings.batch_size}, {settings.steps} steps, median of {settings.repeats}; "
        f"jax {jax.__version__}, keras {keras.__version__}"
    )
    lines = [
        header,
        "",
        "| layout | mesh | fit images/s | jax.jit images/s | ratio fit/jit |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['layout']} | {row['mesh']} | {row['fit_images_per_s']:,.1f} | "
            f"{row['jit_images_per_s']:,.1f} | {row['ratio']:.3f} |"
        )
    return "\n".join(lines)
