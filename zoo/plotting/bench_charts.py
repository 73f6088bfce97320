"""The charts of docs/performance.md, from a benchmark's results (``zoo bench X --plot PNG``)."""

from zoo.plotting._matplotlib import pyplot, save
from zoo.units import KIB, MIB


def plot_attention_memory(memory, output, *, labels=None, title=None):
    """Per-device temporary memory against sequence length T, one line per kernel, one
    panel per device count N (``zoo bench attention``); returns ``output``.

    ``memory``: the benchmark's memory rows, ``{"length": T, "devices": N, "temp":
    {kernel: bytes or None}}``; ``labels``: kernel -> legend text."""
    labels = labels or {}
    devices = sorted({row["devices"] for row in memory})
    plt = pyplot()
    figure, axes = plt.subplots(1, len(devices), figsize=(5.5 * len(devices), 4.2), sharey=True, squeeze=False)
    for axis, n in zip(axes[0], devices):
        rows = sorted((row for row in memory if row["devices"] == n), key=lambda row: row["length"])
        for kernel in rows[0]["temp"]:
            points = [(row["length"], row["temp"][kernel]) for row in rows if row["temp"].get(kernel) is not None]
            if points:
                axis.plot([t for t, _ in points], [b / MIB for _, b in points], "o-", label=labels.get(kernel, kernel))
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks([row["length"] for row in rows], [f"{row['length']:,}" for row in rows])
        axis.set_title(f"N = {n} devices on 'seq'", fontsize=10)
        axis.set_xlabel("sequence length T")
        axis.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("temporary memory per device (MiB)")
    axes[0, 0].legend(fontsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    return save(figure, output)


def plot_context_memory(runs, output, *, title=None):
    """Per-device temporary memory and bytes sent per step, one bar per run (layout, mesh
    and global batch) of ``zoo bench context``; returns ``output``. ``runs``: the
    benchmark's ``Run`` objects (``mesh``, ``batch``, ``kind``, ``temp``, ``sent``)."""
    names = [f"{_get(run, 'kind')}\n{_get(run, 'mesh')}, B={_get(run, 'batch')}" for run in runs]
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(11, 0.9 * len(runs) + 1.8), sharey=True)
    for axis, key, what in (
        (axes[0], "temp", "temporary memory per device (MiB)"),
        (axes[1], "sent", "sent per device per step (MiB)"),
    ):
        values = [_get(run, key) / MIB for run in runs]
        colors = ["tab:red" if _get(run, "kind") == "data-parallel" else "tab:blue" for run in runs]
        bars = axis.barh(range(len(runs)), values, color=colors)
        axis.bar_label(bars, [f"{v:,.1f}" for v in values], fontsize=8, padding=2)
        low, high = min(v for v in values if v > 0), max(values)
        if high / low > 50:  # orders of magnitude apart (a materialising baseline): log scale, every bar visible
            axis.set_xscale("log")
            axis.set_xlim(low / 3, high * 4)
        else:
            axis.set_xlim(0, high * 1.2)
        axis.set_xlabel(what)
        axis.grid(alpha=0.3, axis="x", which="both")
    axes[0].set_yticks(range(len(runs)), names, fontsize=8)
    axes[0].invert_yaxis()
    if title:
        figure.suptitle(title, fontsize=10)
    return save(figure, output)


def plot_tp_bytes(rows, output, *, title=None):
    """Bytes each device sends over the ``model`` axis, one group of bars per MLP variant,
    one bar per implementation (explicit kernels, GSPMD, Megatron's minimum) of
    ``zoo bench tp``; returns ``output``. ``rows``: the benchmark's rows (``variant``,
    ``implementation``, ``model_sent_bytes``)."""
    variants = list(dict.fromkeys(row["variant"] for row in rows))
    seen = list(dict.fromkeys(row["implementation"] for row in rows))
    last = [
        name for name in seen if name == "GSPMD" or name.startswith("minimum")
    ]  # the baselines, right of the kernels
    implementations = [name for name in seen if name not in last] + last
    width = 0.8 / len(implementations)
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(7, 2.4 * len(variants)), 4.2))
    for index, implementation in enumerate(implementations):
        xs, values = [], []
        for position, variant in enumerate(variants):
            row = next((r for r in rows if r["variant"] == variant and r["implementation"] == implementation), None)
            if row is not None:
                xs.append(position + (index - (len(implementations) - 1) / 2) * width)
                values.append(row["model_sent_bytes"] / KIB)
        hatch = "//" if implementation.startswith("minimum") else None
        bars = axis.bar(xs, values, width, label=implementation, hatch=hatch)
        axis.bar_label(bars, [f"{v:,.0f}" for v in values], fontsize=7, padding=1)
    axis.set_xticks(range(len(variants)), variants, fontsize=9)
    axis.set_ylabel("sent over 'model' per device (KiB)")
    axis.grid(alpha=0.3, axis="y")
    axis.legend(fontsize=8)
    if title:
        axis.set_title(title, fontsize=10)
    return save(figure, output)


def _get(item, name):
    return item[name] if isinstance(item, dict) else getattr(item, name)
