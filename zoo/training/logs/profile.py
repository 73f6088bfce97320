"""``ProfileSteps``: a ``jax.profiler`` trace of a few training steps, as a Keras callback.

Open the trace with TensorBoard's profile plugin or xprof (``xprof --logdir DIR``), or
load ``*.trace.json.gz`` into Perfetto (ui.perfetto.dev). Trace steps after the first:
step 0 is XLA compilation.
"""

import jax
import keras

from zoo.distribution.multihost import is_primary


def trace_options():
    """``jax.profiler.ProfileOptions`` for a training trace: device and host ops, no Python
    tracer (JAX's default records every Python call of the traced steps, which slows the
    very steps measured; a CI worker was once found spinning inside such a traced step for
    minutes, its memory at 4.3 GB)."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    return options


class ProfileSteps(keras.callbacks.Callback):
    """Trace training steps ``[start_step, start_step + num_steps)`` into ``log_dir``.

    JAX writes ``log_dir/plugins/profile/<run>/<host>.xplane.pb`` (and a
    ``.trace.json.gz``). Steps are counted from 0 over the whole ``fit`` (across
    epochs), one per training batch Keras reports. The trace stops after the last
    traced step's results are ready, or at the end of training if fewer steps ran.

    Args:
        log_dir: folder for the trace.
        start_step: first step traced (0-based; default 2, after compilation).
        num_steps: how many steps to trace.
        primary_only: trace on process 0 only (by default every process traces its
            own devices into the same folder, one file per host).
    """

    def __init__(self, log_dir, start_step=2, num_steps=3, primary_only=False):
        super().__init__()
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be a non-negative integer, got {start_step!r}")
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        self.log_dir = str(log_dir)
        self.start_step = start_step
        self.num_steps = num_steps
        self.primary_only = primary_only
        self.traced_steps = []  # the steps the trace covers, once written

    def on_train_begin(self, logs=None):
        self._step = 0
        self._tracing = False
        self._enabled = is_primary() or not self.primary_only

    def on_train_batch_begin(self, batch, logs=None):
        if self._enabled and self._step == self.start_step:
            jax.profiler.start_trace(self.log_dir, profiler_options=trace_options())
            self._tracing = True

    def on_train_batch_end(self, batch, logs=None):
        if self._tracing:
            self.traced_steps.append(self._step)
            if self._step == self.start_step + self.num_steps - 1:
                self._stop(logs)
        self._step += 1

    def on_train_end(self, logs=None):
        if self._tracing:
            self._stop(logs)

    def _stop(self, logs):
        jax.block_until_ready([v for v in (logs or {}).values() if isinstance(v, jax.Array)])
        jax.profiler.stop_trace()
        self._tracing = False
