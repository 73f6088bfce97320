"""What a training run reports and writes: ``report`` (the lines a run prints and the
figures it puts into Keras' ``logs``: step time, throughput, MFU), ``run_logs``
(``metrics.csv``, ``steps.csv`` and TensorBoard event files in the run folder) and
``profile`` (a ``jax.profiler`` trace of a few steps)."""

from zoo.training.logs.profile import ProfileSteps
from zoo.training.logs.report import STEP_TIME, StepReport, rate_name
from zoo.training.logs.run_logs import METRICS_FILE, STEPS_FILE, run_log_callbacks

__all__ = ["METRICS_FILE", "STEPS_FILE", "STEP_TIME", "ProfileSteps", "StepReport", "rate_name", "run_log_callbacks"]
