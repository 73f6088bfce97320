"""What ``zoo bench step`` and its keras-hub peer share: random tokens, the timed fits, one
table row's figures, the device's memory counters."""

import statistics
import time


def random_tokens(settings, vocabulary_size, rows):
    """``(x, y)`` int32 (rows, T): uniform random tokens and the next-token targets."""
    import numpy as np

    x = np.random.default_rng(settings.seed).integers(0, vocabulary_size, (rows, settings.sequence_length), np.int32)
    return x, np.roll(x, -1, axis=1)


def time_fits(fit, settings):
    """``(compile_s, [step_s per repeat], fit_overhead_s)``: one 1-step fit (compiles), one warm
    fit, then ``repeats`` pairs of fits of N and 2N steps (N = ``settings.steps``), interleaved.

    A step is what a fit's N more steps add, per step: ``(t(2N) - t(N)) / N``, the time a
    step takes inside a long epoch. The fit's own fixed cost (its data adapter and callbacks
    at the start, writing the variables back at the end) is reported beside it, not spread
    over the steps: ``t(N) - N x step``, the median. Where noise makes a pair's 2N-step fit
    no slower than its N-step one (tiny CPU steps), that pair's step is ``t(2N) / 2N``.
    """
    start = time.perf_counter()
    fit(1)
    first = time.perf_counter() - start
    n = settings.steps
    fit(n)  # warm: the data adapter, the callbacks
    steps, short_fits = [], []
    for _ in range(settings.repeats):
        short, long = _timed(fit, n), _timed(fit, 2 * n)
        steps.append((long - short) / n if long > short else long / (2 * n))
        short_fits.append(short)
    step = statistics.median(steps)
    return max(first - step, 0.0), steps, max(statistics.median(short_fits) - n * step, 0.0)


def _timed(fit, steps):
    start = time.perf_counter()
    fit(steps)
    return time.perf_counter() - start


def step_row(name, params, compile_s, steps, flops, settings):
    """One table row: the median step, tokens/s, and MFU where the device's peak is known."""
    import jax

    from zoo.measure import mfu

    step = statistics.median(steps)
    tokens = settings.batch_size * settings.sequence_length
    row = {"model": name, "parameters": params, "compile_s": compile_s, "step_s": step, "steps_s": steps}
    row["tokens_per_s"] = tokens / step
    row["flops_per_step"] = flops
    try:
        peak = mfu.resolve_peak_flops(settings.peak_tflops)
    except mfu.UnknownDeviceError:
        peak = None  # CPU: no MFU
    row["mfu"] = mfu.mfu(flops, step, jax.device_count(), peak) if peak else None
    return row


def device_memory(report=None):
    """``{"peak_bytes": ..., "limit_bytes": ...}`` from the first device's own counters (None
    where the backend keeps none: CPU); ``report`` also gets every counter, in one line.

    The peak is ``peak_bytes_in_use + peak_bytes_reserved``: on the TPU v5e a program's
    temporaries are held apart from the buffers in use, as memory the runtime reserves for
    the loaded program, and ``peak_bytes_in_use`` alone read 2.86 GiB for gpt_1b steps whose
    compiled footprints are 4.56 and 6.29 GiB; with ``peak_bytes_reserved`` (1.94 and 3.75
    GB) they read 4.66 and 6.34 GiB (docs/performance.md, fifteenth session). A backend
    that keeps no reservation counter gives its peak in use."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if report is not None and stats:
        report(
            "device memory counters: "
            + ", ".join(
                f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}"
                for key, value in sorted(stats.items())
            )
        )
    peak = stats.get("peak_bytes_in_use")
    if peak is not None:
        peak += stats.get("peak_bytes_reserved", 0)
    return {"peak_bytes": peak, "limit_bytes": stats.get("bytes_limit")}
