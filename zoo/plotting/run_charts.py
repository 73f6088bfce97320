"""``zoo plot RUN_DIR``: a run's curves from its ``metrics.csv`` (and ``steps.csv``) as one PNG."""

import csv
import math
import os

from zoo.plotting._matplotlib import pyplot, save

DEFAULT_IMAGE = "metrics.png"  # written into the run folder unless told otherwise


def plot_run(run_dir, output=None):
    """Draw loss / val_loss, accuracy (where logged), throughput and MFU (where logged)
    against the optimizer step, from ``run_dir/metrics.csv`` (one point per epoch) and
    ``run_dir/steps.csv`` (the reported steps, when present); returns the PNG's path
    (default ``run_dir/metrics.png``). ``run_dir`` may also name the ``metrics.csv``."""
    from zoo.training.logs.run_logs import METRICS_FILE, STEPS_FILE

    if os.path.isfile(run_dir):
        run_dir = os.path.dirname(os.path.abspath(run_dir))
    metrics_path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(metrics_path):
        raise FileNotFoundError(
            f"no {METRICS_FILE} in {run_dir!r}: give the folder a zoo train or zoo finetune run wrote it to (beside its --output)"
        )
    epochs = _read(metrics_path)
    steps = _read(os.path.join(run_dir, STEPS_FILE)) if os.path.isfile(os.path.join(run_dir, STEPS_FILE)) else []
    if not epochs and not steps:
        raise ValueError(f"{metrics_path} has no rows yet: plot it once an epoch has finished")
    panels = _panels(epochs, steps)
    plt = pyplot()
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), sharex=True, squeeze=False)
    for axis, (title, series) in zip(axes[:, 0], panels):
        for label, (xs, ys), style in series:
            axis.plot(xs, ys, style, label=label, markersize=5, linewidth=1.2)
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[-1, 0].set_xlabel("optimizer step" if _has(epochs + steps, "step") else "epoch")
    figure.suptitle(os.path.basename(os.path.abspath(run_dir)) or run_dir, fontsize=11)
    return save(figure, output or os.path.join(run_dir, DEFAULT_IMAGE))


def _read(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _has(rows, key):
    return any(row.get(key) not in (None, "") for row in rows)


def _series(rows, key):
    """``(xs, ys)``: ``key`` against the step (the epoch where there is no step column), numbers only."""
    x_key = "step" if _has(rows, "step") else "epoch"
    points = [(_number(row.get(x_key)), _number(row.get(key))) for row in rows]
    points = [(x, y) for x, y in points if x is not None and y is not None]
    return [x for x, _ in points], [y for _, y in points]


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _panels(epochs, steps):
    """``[(title, [(label, (xs, ys), style)])]``: the charts with something to show."""
    keys = sorted({key for row in epochs + steps for key in row} - {"epoch", "step"})
    panels = []

    def panel(title, names, scale=1.0):
        series = []
        for name in names:
            if _has(steps, name) and not name.startswith("val_"):
                xs, ys = _series(steps, name)
                series.append((f"{name} (reported steps)", (xs, [y * scale for y in ys]), "-"))
            if _has(epochs, name):
                xs, ys = _series(epochs, name)
                series.append(
                    (f"{name} (epoch)", (xs, [y * scale for y in ys]), "o--" if name.startswith("val_") else "o-")
                )
        if series:
            panels.append((title, series))

    panel("loss", [key for key in keys if key in ("loss", "val_loss")])
    panel("accuracy", [key for key in keys if key.endswith("accuracy")])
    panel("throughput (per second, all devices)", [key for key in keys if key.endswith("_per_second")])
    panel("MFU (%)", [key for key in keys if key == "mfu"], scale=100.0)
    return panels
