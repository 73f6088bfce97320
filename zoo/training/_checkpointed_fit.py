"""``model.fit`` with optional periodic checkpoints and exact resume, for every training job.

A job's settings carry ``checkpoint_dir``, ``checkpoint_every``, ``keep`` and ``resume``
(see ``docs/checkpoints.md``); the job describes its data (``data``: what the saved
data position refers to, so a resume under other data is refused).
"""

from zoo.training.callbacks import PeriodicCheckpoint, SynchronousSteps
from zoo.training.checkpoints import (
    CheckpointError,
    Checkpoints,
    ResumableBatches,
    TrainingPosition,
    describe_holder,
    fit_from,
)
from zoo.training.interrupts import StopAtSignal, stop_on_signals
from zoo.training.logs.run_logs import run_log_callbacks


def check_checkpoint_options(settings):
    if settings.resume and not settings.checkpoint_dir:
        raise ValueError("resume continues from checkpoint_dir: give --checkpoint-dir too")
    for name in ("checkpoint_every", "keep"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def open_checkpoints(settings, data, model, report):
    """The run's ``Checkpoints`` (or None) and the position training starts from.

    The model's optimizer must be built (its state is restored too)."""
    if not settings.checkpoint_dir:
        return None, TrainingPosition()
    checkpoints = Checkpoints(settings.checkpoint_dir, keep=settings.keep, data=data)
    stale = checkpoints.lock()
    if stale:
        report(f"checkpoints: took over the lock a stopped run left ({describe_holder(stale)})")
    existing = checkpoints.existing_steps()
    if existing and not settings.resume:
        checkpoints.close()
        raise CheckpointError(
            checkpoints.directory,
            f"already holds checkpoints (steps {', '.join(map(str, existing))}); pass --resume to continue "
            "from them, or choose another --checkpoint-dir",
        )
    try:
        position = checkpoints.resume(model, report) if settings.resume else None
    except BaseException:
        checkpoints.close()
        raise
    if position is None:
        report(
            f"checkpoints: every {settings.checkpoint_every} steps to {checkpoints.directory}, keeping {settings.keep}"
        )
        return checkpoints, TrainingPosition()
    return checkpoints, position


def checkpointed_fit(
    model, train_data, *, settings, data, epochs, validation_data, callbacks, report, verbose=1, run_dir=None
):
    """Fit ``train_data`` (a ``DivisibleBatches``) for ``epochs``, saving and resuming
    checkpoints as ``settings`` says; returns the history dict. With ``run_dir`` the run's
    metrics go to ``run_dir/metrics.csv`` and ``steps.csv`` (``zoo.training.logs.run_logs``),
    continued on resume.

    SIGINT and SIGTERM stop training at the next step boundary: a checkpoint is written
    (when the run checkpoints) and ``TrainingInterrupted`` is raised (``zoo.training.interrupts``).
    """
    check_checkpoint_options(settings)
    model.optimizer.build(model.trainable_variables)  # its state must exist before a restore
    checkpoints, start = open_checkpoints(settings, data, model, report)
    saver = None
    if checkpoints is not None:
        saver = PeriodicCheckpoint(
            checkpoints, every=settings.checkpoint_every, steps_per_epoch=len(train_data), start=start, report=report
        )
    # DivisibleBatches reshuffles itself, seeded per epoch (fit_from passes shuffle=False to fit).
    resumable = ResumableBatches(train_data, epoch=start.epoch, start_batch=start.batch)
    try:
        with stop_on_signals() as signals:
            stopper = StopAtSignal(signals, saver)
            # the figures (StepReport, Throughput) first, then the files that log them; the saver's position, then the stop
            logs = run_log_callbacks(run_dir, resume=start.step > 0, initial_step=start.step) if run_dir else []
            callbacks = [*callbacks, *logs, *([saver] if saver else []), stopper, SynchronousSteps()]
            history = fit_from(
                model, resumable, epochs=epochs, validation_data=validation_data, callbacks=callbacks, verbose=verbose
            )
            stopper.stop_if_signalled()  # a signal during the last step
        if saver is not None and saver.save():
            report(f"saved checkpoint {saver.position.step} to {checkpoints.directory}")
    finally:
        if checkpoints is not None:
            checkpoints.close()
    return history
