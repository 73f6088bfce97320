"""What a training run prints: its config and mesh at the start, step time / throughput /
MFU as it goes. Only process 0 prints (every process measures, so all do the same work).

The figures also go into the ``logs`` dict Keras hands to the callbacks after this one
(``CSVLogger``, TensorBoard, ``History``, ``zoo.training.logs.run_logs``) under the names of
``log_names``: ``<unit>_per_second`` (``tokens_per_second``, ``images_per_second``,
``examples_per_second``), ``step_time_s`` and, when known, ``mfu`` (a fraction). A
callback sees them only if it comes after the one that writes them in ``callbacks=[...]``.
"""

import dataclasses
import time

import jax
import keras
import numpy as np

from zoo.distribution.mesh import describe_mesh
from zoo.distribution.multihost import is_primary
from zoo.measure.mfu import mfu

STEP_TIME = "step_time_s"  # seconds per optimizer step (wall clock, averaged)
MFU = "mfu"  # model FLOPs utilisation, a fraction


def rate_name(unit):
    """The logs key of a throughput in ``unit``: ``tokens`` -> ``tokens_per_second``."""
    return f"{unit}_per_second"


def log_names(unit):
    """Every logs key ``StepReport`` may write for ``unit``."""
    return (rate_name(unit), STEP_TIME, MFU)


def own_line(callback, line):
    """``line`` so that it prints on a line of its own while Keras' progress bar
    (``fit(verbose=1)``) sits unfinished on the current one: with a newline in front."""
    verbose = (getattr(callback, "params", None) or {}).get("verbose")
    return "\n" + line if verbose == 1 else line


@dataclasses.dataclass(frozen=True)
class StepStats:
    """Averages over the steps since the previous report."""

    step: int  # steps done so far (1-based), at the end of the window
    steps: int  # steps in the window
    step_time_s: float  # wall-clock seconds per step
    items_per_s: float  # tokens (or images) per second, all devices
    items_per_s_per_device: float
    mfu: float | None  # a fraction; None without flops_per_step or a peak


class StepReport(keras.callbacks.Callback):
    """Every ``every`` steps: step time, throughput (total and per device) and MFU.

    Time is wall clock between the ends of two training batches, after the step's
    results are ready (Keras has turned the logs into Python floats, which waits for
    the device; any ``jax.Array`` left in them is blocked on), so JAX's asynchronous
    dispatch cannot make a step look faster than it is. The first step (XLA
    compilation) is reported on its own and left out of the averages.

    Each reported step also writes ``<unit>_per_second``, ``step_time_s`` and ``mfu``
    (when known) into that batch's ``logs``; each epoch's ``logs`` get the same figures
    averaged over the epoch's steps after its first (none for a one-step epoch).

    Args:
        items_per_step: tokens (or images) in one global batch, e.g. B * T.
        unit: what ``items_per_step`` counts, for the printout.
        flops_per_step: model FLOPs of one training step (``zoo.measure.mfu``); None
            leaves MFU out.
        peak_flops_per_device: dense peak FLOP/s of one device
            (``mfu.resolve_peak_flops``); None leaves MFU out.
        num_devices: devices the step runs on (default: all, ``jax.device_count()``).
        every: report every this many steps.
        report: where lines go (``print``); called on process 0 only.
    """

    def __init__(
        self,
        items_per_step,
        *,
        unit="tokens",
        flops_per_step=None,
        peak_flops_per_device=None,
        num_devices=None,
        every=10,
        report=print,
    ):
        super().__init__()
        if not items_per_step > 0:
            raise ValueError(f"items_per_step must be positive, got {items_per_step!r}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.items_per_step = items_per_step
        self.unit = unit
        self.flops_per_step = flops_per_step
        self.peak_flops_per_device = peak_flops_per_device
        self.num_devices = num_devices
        self.every = every
        self.report = report
        self.first_step_s = None  # compilation + first step
        self.stats = []  # StepStats, one per report

    def on_train_begin(self, logs=None):
        self._devices = self.num_devices or jax.device_count()
        self._primary = is_primary()
        self._done = self._step = 0  # steps finished before the current epoch, and in all
        self._window = None  # (steps done, time) at the start of the current window
        self._epoch_start = None  # (steps done, time) at the end of the epoch's first step
        self._last = None  # (steps done, time) at the end of the latest step
        self._begin = None

    def on_epoch_begin(self, epoch, logs=None):
        self._window = self._epoch_start = None  # epoch boundaries (validation, callbacks) are not step time

    def on_epoch_end(self, epoch, logs=None):
        self._done = self._step
        if logs is not None and self._epoch_start is not None and self._last[0] > self._epoch_start[0]:
            steps = self._last[0] - self._epoch_start[0]
            logs.update(self._figures((self._last[1] - self._epoch_start[1]) / steps))

    def on_train_batch_begin(self, batch, logs=None):
        if self._begin is None:
            self._begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        jax.block_until_ready([v for v in (logs or {}).values() if isinstance(v, jax.Array)])
        now = time.perf_counter()
        self._step = self._done + batch + 1  # Keras passes the index of the last step run
        if self.first_step_s is None:
            self.first_step_s = now - self._begin
            self._say(f"step {self._step}: {self.first_step_s:.3f} s (XLA compilation + first step)")
        self._last = (self._step, now)
        if self._epoch_start is None:
            self._epoch_start = self._last
        if self._window is None:
            self._window = (self._step, now)
            return
        steps = self._step - self._window[0]
        if steps >= self.every:
            stats = self._record(steps, now - self._window[1])
            if logs is not None:
                logs.update(self._figures(stats.step_time_s))
            self._window = (self._step, now)

    def _mfu(self, step_time):
        if self.flops_per_step and self.peak_flops_per_device:
            return mfu(self.flops_per_step, step_time, self._devices, self.peak_flops_per_device)
        return None

    def _figures(self, step_time):
        """``{<unit>_per_second, step_time_s[, mfu]}`` for a mean step time: what goes into logs."""
        figures = {rate_name(self.unit): self.items_per_step / step_time, STEP_TIME: step_time}
        utilisation = self._mfu(step_time)
        return figures if utilisation is None else {**figures, MFU: utilisation}

    def _record(self, steps, seconds):
        step_time = seconds / steps
        rate = self.items_per_step / step_time
        stats = StepStats(self._step, steps, step_time, rate, rate / self._devices, self._mfu(step_time))
        self.stats.append(stats)
        self._say(format_stats(stats, self.unit))
        return stats

    def _say(self, line):
        if self._primary:
            self.report(own_line(self, line))


def format_stats(stats, unit="tokens"):
    """``step 20: 12.3 ms/step, 1,234,567 tokens/s (154,321 tokens/s per device), MFU 41.2%``."""
    line = (
        f"step {stats.step}: {stats.step_time_s * 1e3:.1f} ms/step, {stats.items_per_s:,.0f} {unit}/s "
        f"({stats.items_per_s_per_device:,.0f} {unit}/s per device)"
    )
    return line if stats.mfu is None else f"{line}, MFU {stats.mfu:.1%}"


def format_config(config):
    """``name: value`` lines for a dataclass or dict config."""
    items = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    width = max((len(str(k)) for k in items), default=0)
    return [f"{name:<{width}}  {value!r}" for name, value in items.items()]


def print_config(config, report=print):
    """Print the run's config (process 0 only)."""
    if is_primary():
        report("config:")
        for line in format_config(config):
            report("  " + line)


def format_mesh(mesh):
    """Lines describing a ``keras.distribution.DeviceMesh`` across the processes.

    Names each axis with whether it stays inside one process (its collectives run on
    the host's own links: NVLink, ICI within a host) or crosses processes (the network,
    or ICI between hosts).
    """
    devices = np.asarray(mesh.backend_mesh.devices)  # jax.Device objects, in mesh shape
    processes = np.vectorize(lambda d: d.process_index, otypes=[int])(devices)
    kinds = sorted({d.device_kind for d in devices.flat})
    lines = [
        (
            f"mesh: {describe_mesh(mesh)} over {devices.size} x {'/'.join(kinds)} ({devices.flat[0].platform}), "
            f"{len(np.unique(processes))} process(es)"
        )
    ]
    for index, (name, size) in enumerate(zip(mesh.axis_names, mesh.shape)):
        crosses = bool(np.any(np.diff(processes, axis=index))) if size > 1 else False
        lines.append(f"  axis {name!r} of size {size}: {'crosses processes' if crosses else 'within each process'}")
    return lines


def print_mesh(distribution, report=print):
    """Print the distribution's mesh and kind (process 0 only; None: one device)."""
    if not is_primary():
        return
    if distribution is None:
        report(f"distribution: none (one device, {jax.devices()[0].device_kind})")
        return
    batch_axis = getattr(distribution, "batch_dim_name", None)
    report(f"distribution: {type(distribution).__name__}, batch split over {batch_axis!r}")
    for line in format_mesh(distribution.device_mesh):
        report(line)
