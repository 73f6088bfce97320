"""Callbacks shared by the training jobs."""

import time

import jax
import keras

from zoo.training.checkpoints import TrainingPosition
from zoo.training.logs.report import STEP_TIME, rate_name


class Throughput(keras.callbacks.Callback):
    """Measures training examples (images, tokens: ``unit``) per second for each epoch
    (validation excluded).

    The clock runs from the start of the epoch to the end of its last training batch;
    epoch 1 includes XLA compilation. The rate goes into the epoch's ``logs`` as
    ``<unit>_per_second`` (``images_per_second``: ``CSVLogger``, ``History`` and
    ``zoo.training.logs.run_logs`` after this callback see it) and is printed on its own
    line once Keras has printed the epoch's (at the next epoch's start, or the end of
    training), not glued onto its progress bar.

    With ``log_steps=True`` every step's logs also get its own ``step_time_s`` (wall clock
    from the end of the previous step, or from the epoch's start, to the end of this one,
    once its results are ready; the first step includes XLA compilation) and
    ``<unit>_per_second``: ``zoo.training.logs.run_logs`` then writes one ``steps.csv`` row per
    step. For the jobs that have no ``StepReport`` (``zoo train cnn``, ``encoder``, ``vit``).
    """

    def __init__(self, global_batch_size, report=print, unit="images", log_steps=False):
        super().__init__()
        self.global_batch_size = global_batch_size  # examples per step, in ``unit``
        self.report = report
        self.unit = unit
        self.log_steps = log_steps  # each step's time and rate into its logs too
        self.per_epoch = []  # examples/s, one entry per epoch
        self._pending = None  # the last epoch's line, printed after Keras' own

    def on_epoch_begin(self, epoch, logs=None):
        self._flush()
        self._start = time.perf_counter()
        self._end = self._start
        self._examples = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.log_steps and logs is not None:  # the step's results ready, not just dispatched
            jax.block_until_ready([v for v in logs.values() if isinstance(v, jax.Array)])
        now = time.perf_counter()
        if self.log_steps and logs is not None:
            seconds = max(now - self._end, 1e-9)
            logs.update({rate_name(self.unit): self.global_batch_size / seconds, STEP_TIME: seconds})
        self._examples += self.global_batch_size
        self._end = now

    def on_epoch_end(self, epoch, logs=None):
        rate = self._examples / max(self._end - self._start, 1e-9)
        self.per_epoch.append(rate)
        if logs is not None:
            logs[rate_name(self.unit)] = rate
        note = " (includes compilation)" if epoch == 0 else ""
        self._pending = f"epoch {epoch + 1}: {rate:,.1f} {self.unit}/s over {self._examples} {self.unit}{note}"

    def on_train_end(self, logs=None):
        self._flush()

    def _flush(self):
        if self._pending is not None:
            self.report(self._pending)
            self._pending = None


class SynchronousSteps(keras.callbacks.Callback):
    """Makes Keras run every step's callbacks in the main thread: in ``fit``, in its
    validation passes and in ``evaluate`` / ``predict``.

    Without any batch-end hook of the kind, Keras hands each step's logs to a thread pool,
    and on XLA:CPU with several devices a pool thread fetching a step's arrays while the
    main thread dispatches the next step aborts the process ("Fatal Python error: Aborted"
    in ``pythonify_logs``: it stopped a training run, and a validation pass inside ``fit``
    in the tests). Overriding the hooks (they do nothing) turns that off; the cost is one
    host sync per step, which the progress bar makes anyway."""

    def on_train_batch_end(self, batch, logs=None):
        pass

    def on_test_batch_end(self, batch, logs=None):
        pass

    def on_predict_batch_end(self, batch, logs=None):
        pass


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint every ``every`` optimizer steps during ``fit``.

    Args:
        checkpoints: a ``zoo.training.checkpoints.Checkpoints``.
        every: save when the global step reaches a multiple of ``every``.
        steps_per_epoch: batches per epoch (the same in every epoch), to place each
            batch of ``fit`` in (epoch, batch, step).
        start: the ``TrainingPosition`` ``fit`` starts from (its epoch's batches before
            ``start.batch`` are skipped by the data, so ``fit`` numbers batches from 0).
        report: where the one line about a checkpoint that could not be written goes.

    A save that fails to write (a full disk, a quota, a removed folder: an ``OSError``, or
    TensorStore's ``ValueError`` carrying an OS error code) does not stop training: one line
    says which step was not saved, why, and which checkpoint is the last good one; the
    half-written ``<step>.orbax-checkpoint-tmp`` is removed (freeing its space), Orbax's own
    tracebacks about it are dropped, and the next multiple of ``every`` tries again.
    Any other error is raised.
    """

    def __init__(self, checkpoints, *, every, steps_per_epoch, start=None, report=print):
        super().__init__()
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"checkpoint every must be a positive number of steps, got {every!r}")
        self.checkpoints = checkpoints
        self.every = every
        self.steps_per_epoch = steps_per_epoch
        self.start = start or TrainingPosition()
        self.position = self.start  # after the last trained batch
        self.saved_step = self.start.step  # the start is already on disk (or is step 0)
        self.report = report
        self.failed_steps = []  # steps whose save failed to write
        self._tried_step = self.start.step  # the last step a save was tried at, failed or not
        self._epoch = self.start.epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        offset = self.start.batch if self._epoch == self.start.epoch else 0
        step = self._epoch * self.steps_per_epoch + offset + batch + 1
        self.position = TrainingPosition.after(step, self.steps_per_epoch)
        if step // self.every > self._tried_step // self.every:
            self.save(then="training goes on")

    def save(self, then=None):
        """Save at the current position, unless that step is already saved; returns the path,
        or None (nothing to save, or the write failed: then one line says so, ending with ``then``)."""
        if self.position.step == self.saved_step:
            return None
        self._tried_step = self.position.step
        model = self.model  # under JAX this syncs the training state back into the variables
        iterations = int(model.optimizer.iterations)
        # with gradient accumulation the optimizer counts updates, one per N batches
        accumulation = getattr(model.optimizer, "gradient_accumulation_steps", None) or 1
        if iterations != self.position.step // accumulation:
            raise ValueError(
                f"the optimizer has taken {iterations} steps but the data position is step {self.position.step} "
                f"({accumulation} batch(es) per update): is steps_per_epoch={self.steps_per_epoch} right, and does "
                f"fit run one step per batch?"
            )
        path, reason = self.checkpoints.try_save(model, self.position)
        if reason is not None:
            self._failed(reason, then)
            return None
        self.saved_step = self.position.step
        return path

    def _failed(self, reason, then):
        step, directory = self.position.step, self.checkpoints.directory
        self.failed_steps.append(step)
        last = self.checkpoints.latest_complete() or "none"
        line = f"zoo: checkpoint {step} not saved to {directory}: {reason}; the last good checkpoint is {last}"
        self.report(line + (f"; {then}" if then else ""))
