"""A run's numbers on disk: ``metrics.csv``, ``steps.csv`` and TensorBoard event files.

``run_log_callbacks(run_dir)`` returns the Keras callbacks that write them; put them
**after** the callbacks that add figures to the logs (``StepReport``, ``Throughput``):
Keras hands one ``logs`` dict to the callbacks in list order, so a logger placed before
``StepReport`` would write each row without ``tokens_per_second``::

    callbacks = [StepReport(...), PeriodicCheckpoint(...), *run_log_callbacks(run_dir)]

Files (process 0 writes them; the others write nothing):

- ``run_dir/metrics.csv``: one row per epoch: ``epoch`` (1-based), ``step`` (optimizer
  steps done at its end, counted over the whole run), then every key of the epoch's
  logs (``loss``, ``accuracy``, ``val_loss``, ``val_accuracy``, ``tokens_per_second``,
  ``step_time_s``, ``mfu``, ...), sorted by name.
- ``run_dir/steps.csv``: one row per reported step, i.e. each step whose logs carry
  ``step_time_s`` (``StepReport`` every ``every`` steps): ``epoch``, ``step``, then that
  step's logs (``loss`` is Keras' running mean over the epoch so far).
- ``run_dir/tensorboard/``: the same numbers as TensorBoard scalars (``epoch/<key>`` at
  each epoch's step, ``step/<key>`` at each reported step) when ``tensorboardX``
  (``pip install "keras-zoo[tensorboard]"``) or TensorBoard is importable.

A column that appears later in a run (``val_loss`` after the first validation) rewrites
the file with the wider header; a cell a row lacks is empty. With ``resume=True`` the
files are continued: rows after ``initial_step`` (from a run that went on past the
checkpoint it resumes from) are dropped, the rest kept. Without it they start afresh.
"""

import csv
import math
import os

import keras

from zoo.distribution.multihost import is_primary
from zoo.training.logs.report import STEP_TIME

METRICS_FILE = "metrics.csv"  # one row per epoch
STEPS_FILE = "steps.csv"  # one row per reported step
TENSORBOARD_DIR = "tensorboard"
INDEX_COLUMNS = ("epoch", "step")


def run_log_callbacks(run_dir, *, resume=False, initial_step=0):
    """The callbacks that log a run into ``run_dir`` (see the module docstring): put them
    last in ``fit``'s ``callbacks``. ``initial_step``: optimizer steps already done when
    this ``fit`` starts (a resumed run's checkpoint step). Empty on processes other than 0."""
    if not is_primary():
        return []
    callbacks = [RunLog(run_dir, resume=resume, initial_step=initial_step)]
    writer_class = tensorboard_writer_class()
    if writer_class is not None:
        callbacks.append(
            TensorBoardScalars(os.path.join(run_dir, TENSORBOARD_DIR), writer_class, initial_step=initial_step)
        )
    return callbacks


class CSVTable:
    """A CSV file of dict rows whose header grows when a row brings a new key. The file
    exists only once it has a row: a run that reports no step leaves no ``steps.csv``."""

    def __init__(self, path, *, keep=None):
        """``keep(row) -> bool``: existing rows kept (None: start afresh, removing the file
        an earlier run left)."""
        self.path = path
        self.columns, rows = list(INDEX_COLUMNS), []
        if keep is not None and os.path.exists(path):
            with open(path, newline="") as handle:
                reader = csv.DictReader(handle)
                self.columns = _merge(self.columns, reader.fieldnames or [])
                rows = [row for row in reader if keep(row)]
        if rows:
            self._rewrite(rows)
        elif os.path.exists(path):
            os.remove(path)

    def append(self, row):
        row = {key: _cell(value) for key, value in row.items()}
        if not os.path.exists(self.path):
            self.columns = _merge(self.columns, row)
            self._rewrite([])
        elif any(key not in self.columns for key in row):
            self.columns = _merge(self.columns, row)
            self._rewrite(read_rows(self.path))
        with open(self.path, "a", newline="") as handle:
            csv.DictWriter(handle, self.columns, restval="").writerow(row)

    def _rewrite(self, rows):
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, self.columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.path)


def read_rows(path):
    """The rows of a ``metrics.csv`` / ``steps.csv`` as dicts of strings."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _merge(columns, keys):
    """``columns`` then the new ``keys`` sorted, the index columns first."""
    return list(columns) + sorted(key for key in keys if key not in columns)


def _cell(value):
    if hasattr(value, "item"):  # numpy / jax scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # nan, inf: readable by float()
    return value


class _StepCounter(keras.callbacks.Callback):
    """Counts optimizer steps over the whole run (``initial_step`` before this ``fit``)."""

    def __init__(self, initial_step=0):
        super().__init__()
        self.step = initial_step

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1


class RunLog(_StepCounter):
    """Writes ``metrics.csv`` (every epoch) and ``steps.csv`` (every reported step)."""

    def __init__(self, run_dir, *, resume=False, initial_step=0):
        super().__init__(initial_step)
        self.run_dir = run_dir
        self.resume = resume
        self.initial_step = initial_step

    def on_train_begin(self, logs=None):
        keep = (lambda row: _step_of(row) <= self.initial_step) if self.resume else None
        self.epochs = CSVTable(os.path.join(self.run_dir, METRICS_FILE), keep=keep)
        self.steps = CSVTable(os.path.join(self.run_dir, STEPS_FILE), keep=keep)
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if logs and STEP_TIME in logs:
            self.steps.append({"epoch": self._epoch + 1, "step": self.step, **logs})

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({"epoch": epoch + 1, "step": self.step, **(logs or {})})


def _step_of(row):
    try:
        return int(row.get("step") or 0)
    except ValueError:
        return 0


def tensorboard_writer_class():
    """``tensorboardX.SummaryWriter`` or TensorBoard's own event writer, whichever is
    importable (in that order); None without either."""
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    except ImportError:
        pass
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401
    except ImportError:
        return None
    return _TensorBoardWriter


class _TensorBoardWriter:
    """``add_scalar`` / ``flush`` / ``close`` over TensorBoard's ``EventFileWriter``
    (the writer PyTorch's SummaryWriter uses), for when tensorboardX is missing."""

    def __init__(self, logdir):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(logdir)

    def add_scalar(self, tag, value, global_step):
        import time

        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(event_pb2.Event(summary=summary, wall_time=time.time(), step=int(global_step)))

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()


class TensorBoardScalars(_StepCounter):
    """The numbers of ``metrics.csv`` and ``steps.csv`` as TensorBoard scalars."""

    def __init__(self, logdir, writer_class, *, initial_step=0):
        super().__init__(initial_step)
        self.logdir = logdir
        self.writer_class = writer_class
        self.writer = None

    def on_train_begin(self, logs=None):
        self.writer = self.writer_class(self.logdir)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if logs and STEP_TIME in logs:
            self._write("step", logs)

    def on_epoch_end(self, epoch, logs=None):
        self._write("epoch", logs or {})
        self.writer.flush()

    def on_train_end(self, logs=None):
        self.writer.close()

    def _write(self, prefix, logs):
        for key, value in logs.items():
            value = _cell(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{prefix}/{key}", value, self.step)
