"""Ctrl-C and preemption: stop at the next step boundary, save, say how to resume.

A cluster scheduler sends SIGTERM before it preempts a job; a person presses Ctrl-C
(SIGINT). Under ``stop_on_signals`` neither raises inside Keras (whose per-batch log
conversion swallows a ``KeyboardInterrupt`` in a bare ``except``): the handler only
records the signal. ``StopAtSignal``, a callback, looks at that record after each step
and at each epoch's end, in the main thread; there it writes an emergency checkpoint
(when the run checkpoints) and raises ``TrainingInterrupted``, which the CLI turns into
one line and exit status 128 + the signal number (130 for SIGINT, 143 for SIGTERM). A
second signal aborts at once (the process dies of it, as without a handler): the newest
complete checkpoint stays usable, since a checkpoint only appears on disk by an atomic
rename.

Why ``on_train_batch_end``, which makes Keras run the callbacks synchronously: without
any batch-end hook Keras hands each step's logs to a thread pool, and on XLA:CPU with
several devices those threads fetching arrays while the main thread dispatched
validation steps aborted a CI run (a deadlock in XLA:CPU's collectives). Fetching a
step's logs costs a host sync per step; with the flag above it no longer swallows
anything.
"""

import contextlib
import os
import signal
import threading

import keras

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by a signal at a step boundary.

    Attributes: ``signal_number``; ``step`` (optimizer steps trained); ``checkpoint`` (the
    path of the checkpoint holding that step, or None when the run does not checkpoint);
    ``saved`` (False when that step's checkpoint could not be written: ``checkpoint`` is
    then the newest one on disk, or None); ``exit_code`` (128 + the signal number, as a
    shell reports a process the signal killed).
    """

    def __init__(self, signal_number, step, checkpoint=None, saved=True):
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint
        self.saved = saved
        self.exit_code = 128 + signal_number
        super().__init__(self.describe())

    def describe(self, resume_command=None):
        """``interrupted by SIGINT at step 7; checkpoint saved to …; resume with …`` (one line)."""
        name = signal.Signals(self.signal_number).name
        if self.step == 0:
            return f"interrupted by {name} before the first step; nothing was trained or saved"
        how = resume_command or "the same command with --resume"
        if not self.saved:
            if self.checkpoint is None:
                return f"interrupted by {name} at step {self.step}; its checkpoint could not be written and there is no earlier one, so a new run starts over"
            return f"interrupted by {name} at step {self.step}; its checkpoint could not be written, the newest is {self.checkpoint}; resume from it with: {how}"
        if self.checkpoint is None:
            return f"interrupted by {name} at step {self.step}; no checkpoint (the run has no --checkpoint-dir), so a new run starts over"
        return f"interrupted by {name} at step {self.step}; checkpoint saved to {self.checkpoint}; resume with: {how}"


class SignalRecord:
    """The first SIGINT/SIGTERM received under ``stop_on_signals`` (``number``, None before)."""

    def __init__(self):
        self.number = None

    def handle(self, number, frame):
        if self.number is not None:  # the second one: die of it now, as without a handler
            os.write(
                2,
                f"zoo: aborted by a second {signal.Signals(number).name}; the newest complete checkpoint is intact\n".encode(),
            )
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
        self.number = number


@contextlib.contextmanager
def stop_on_signals():
    """Record SIGINT and SIGTERM instead of acting on them; yields the ``SignalRecord``.

    Outside the main thread (where Python cannot install handlers) signals keep their
    usual effect and the record stays empty. The previous handlers come back on exit.
    """
    record = SignalRecord()
    if threading.current_thread() is not threading.main_thread():
        yield record
        return
    previous = {number: signal.signal(number, record.handle) for number in SIGNALS}
    try:
        yield record
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class StopAtSignal(keras.callbacks.Callback):
    """Raises ``TrainingInterrupted`` at the first step boundary after a recorded signal.

    Args:
        record: the ``SignalRecord`` of ``stop_on_signals``.
        saver: the run's ``PeriodicCheckpoint`` (it must come before this callback in the
            list, so its position counts the step just trained), or None when the run does
            not checkpoint.
    """

    def __init__(self, record, saver=None):
        super().__init__()
        self.record = record
        self.saver = saver

    def on_train_batch_end(self, batch, logs=None):
        self.stop_if_signalled()

    def on_epoch_end(self, epoch, logs=None):
        self.stop_if_signalled()

    def stop_if_signalled(self):
        if self.record.number is None:
            return
        if self.saver is None:
            raise TrainingInterrupted(self.record.number, int(self.model.optimizer.iterations))
        self.saver.save(then="stopping")  # the emergency checkpoint (nothing to do if this step is on disk)
        step = self.saver.position.step
        if self.saver.saved_step == step:
            raise TrainingInterrupted(
                self.record.number, step, os.path.join(self.saver.checkpoints.directory, str(step))
            )
        # its write failed (one line said why): the newest checkpoint on disk is where a resume starts
        raise TrainingInterrupted(self.record.number, step, self.saver.checkpoints.latest_complete(), saved=False)
