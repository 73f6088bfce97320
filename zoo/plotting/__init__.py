"""Pictures of a run and of the benchmarks, as PNG files (matplotlib, an optional extra:
``pip install "keras-zoo[plot]"``; imported only when a chart is drawn, Agg backend).

- ``plot_run(run_dir)``: loss / val_loss, accuracy and throughput curves from a run's
  ``metrics.csv`` and ``steps.csv`` (``zoo.training.logs.run_logs``); ``zoo plot RUN_DIR``.
- ``plot_attention_memory``: per-device memory against sequence length
  (``zoo bench attention --plot``).
- ``plot_context_memory``, ``plot_tp_bytes``: memory and bytes per layout
  (``zoo bench context --plot``, ``zoo bench tp --plot``).
"""

from zoo.plotting._matplotlib import PLOT_INSTALL, pyplot
from zoo.plotting.bench_charts import (
    plot_attention_memory,
    plot_context_memory,
    plot_tp_bytes,
)
from zoo.plotting.run_charts import plot_run

__all__ = ["PLOT_INSTALL", "plot_attention_memory", "plot_context_memory", "plot_run", "plot_tp_bytes", "pyplot"]
