"""A checkpoint that cannot be written (a full disk) never stops or loses a run.

The disk is real: a small tmpfs that a callback fills and frees between steps, so Orbax and
TensorStore meet a real ``ENOSPC``. Mounting needs root (CI and the developers' machines
run as root); elsewhere those tests skip and say why, and the reason-reading test still runs.
"""

import errno
import functools
import gc
import logging
import os
import subprocess

import keras
import pytest

from tests.training._tiny import BATCH, EXAMPLES, assert_bitwise_equal, batches, build, values
from zoo.distribution import build_distributed, distribution_for
from zoo.models import SmallCNN
from zoo.training.callbacks import PeriodicCheckpoint
from zoo.training.checkpoints import CheckpointError, Checkpoints, ResumableBatches, fit_from, write_failure
from zoo.training.interrupts import SignalRecord, StopAtSignal, TrainingInterrupted

DATA = {"examples": EXAMPLES, "batch_size": BATCH, "seed": 0}
STEPS_PER_EPOCH = EXAMPLES // BATCH  # 4
# What TensorStore raised when the tmpfs filled under a 1,031,377-byte array write (orbax 0.12):
TENSORSTORE_FULL = (
    'RESOURCE_EXHAUSTED: Error writing "optimizer.18/0" in OCDBT database at local file "/ck/8.orbax-checkpoint-tmp/'
    'state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed writing: "/ck/8.orbax-checkpoint-tmp/d/6d64": '
    "Failed to write 1031377 bytes to file 15: No space left on device [os_error_code='28']"
)


@pytest.mark.parametrize(
    "error, reason",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device (ENOSPC)"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded (EDQUOT)"),
        (ValueError(TENSORSTORE_FULL), "No space left on device (ENOSPC)"),
        (ValueError('NOT_FOUND: Error writing "x": gone'), 'NOT_FOUND: Error writing "x": gone'),
        (ValueError("could not broadcast (3,) into (4,)"), None),  # not a write: raised
        (CheckpointError("/ck/4", "already exists; a run saves each step once"), None),  # a refused step: raised
    ],
)
def test_the_reason_a_write_failed_is_read_from_the_error(error, reason):
    assert write_failure(error) == reason


def test_late_orbax_records_about_a_reported_failure_are_dropped_and_others_kept():
    """After a reported failure, a record naming its step directory, and an Orbax thread's
    one-line report of the same OS error (no path in it), are dropped; a record of another
    error, or of another folder, is kept."""
    import logging

    from zoo.training.checkpoints._write_failure import FailedWrites

    writes = FailedWrites()  # not the process' one: nothing installed on the loggers

    def record(text):
        return logging.LogRecord("absl", logging.WARNING, __file__, 1, text, None, None)

    thread = "[process=0][thread=array_type_handler][operation_id=49] _SignalingThread.run() raised an exception: "
    writes.add("/ck/4.orbax-checkpoint-tmp", ValueError(TENSORSTORE_FULL))
    kept = [
        text
        for text in (
            "Error writing /ck/4.orbax-checkpoint-tmp/d/6d64",
            thread + "[Errno 28] No space left on device",
            thread + "[Errno 13] Permission denied",
            "Error writing /ck/6.orbax-checkpoint-tmp/d/6d64",
        )
        if writes.filter(record(text))
    ]
    assert kept == [thread + "[Errno 13] Permission denied", "Error writing /ck/6.orbax-checkpoint-tmp/d/6d64"]


@pytest.fixture
def disk(tmp_path):
    """A 16 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs, and mount refused: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class DiskFiller(keras.callbacks.Callback):
    """Fills ``disk`` after the steps in ``fill_after`` and frees it after those in ``free_after``
    (before the saver, which comes after it in the callback list, sees the step)."""

    def __init__(self, disk, fill_after=(), free_after=(), signal_after=None, record=None):
        super().__init__()
        self.filler = disk / "filler"
        self.fill_after, self.free_after = set(fill_after), set(free_after)
        self.signal_after, self.record = signal_after, record
        self.step = 0

    def fill(self, room=256 * 1024):
        """Leaves ``room`` bytes: a save's first writes succeed and later ones, in Orbax's
        background threads, fail (a disk with nothing left fails the first write, quietly)."""
        stats = os.statvfs(self.filler.parent)
        with open(self.filler, "ab") as handle:
            handle.write(b"\0" * max(stats.f_bavail * stats.f_frsize - room, 0))

    def free(self):
        self.filler.unlink(missing_ok=True)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step in self.fill_after:
            self.fill()
        if self.step in self.free_after:
            self.free()
        if self.step == self.signal_after:
            self.record.number = 2  # SIGINT, recorded as stop_on_signals' handler records it


def _sharded_model():
    """The tiny CNN split over data=2,model=4 with a 4,096-wide hidden layer: its arrays are
    written as concurrent shards of up to 1 MiB, so a full disk fails several background
    writes at once, which Orbax logs with tracebacks (one small array fails quietly)."""
    return build_distributed(
        functools.partial(build, hidden_units=4096), distribution_for(SmallCNN, "model", "data=2,model=4")
    )


def _orbax_noise(caplog, capfd):
    gc.collect()  # the abandoned writes' futures log their errors when collected
    logged = [r.getMessage() for r in caplog.records if r.name in ("absl", "asyncio") and r.levelno >= logging.WARNING]
    out, err = capfd.readouterr()
    return [*logged, *(line for line in (out + err).splitlines() if "Traceback" in line or "orbax" in line)]


def test_a_full_disk_at_a_checkpoint_skips_that_step_and_training_goes_on(disk, caplog, capfd):
    """2 epochs (8 steps), a checkpoint every 2 steps; the disk is full for the saves of steps 4
    and 8 and at the end, free for 2 and 6: one line per failed save, the run trains on, the
    half-written steps are removed, the saved ones hold exactly the trained state, and the end
    retries the last step once the disk has room."""
    caplog.set_level(logging.INFO)
    directory = str(disk / "checkpoints")
    lines, model = [], _sharded_model()
    filler = DiskFiller(disk, fill_after=(3, 7), free_after=(5,))
    with Checkpoints(directory, keep=None, data=DATA) as checkpoints:
        saver = PeriodicCheckpoint(checkpoints, every=2, steps_per_epoch=STEPS_PER_EPOCH, report=lines.append)
        fit_from(model, ResumableBatches(batches()), epochs=2, callbacks=[filler, saver], verbose=0)
        assert saver.save() is None  # the end-of-training save: still full
        filler.free()
        assert saver.save() == os.path.join(directory, "8")  # room again: the last step is saved
        assert checkpoints.steps() == [2, 6, 8]
        _, saved = checkpoints.read(checkpoints.latest_complete())
    not_saved = f"not saved to {directory}: No space left on device (ENOSPC); the last good checkpoint is {directory}"
    assert lines == [
        f"zoo: checkpoint 4 {not_saved}/2; training goes on",
        f"zoo: checkpoint 8 {not_saved}/6; training goes on",
        f"zoo: checkpoint 8 {not_saved}/6",
    ]
    assert saver.failed_steps == [4, 8, 8]
    assert sorted(os.listdir(directory)) == ["2", "6", "8"]  # no half-written step left behind
    assert_bitwise_equal(saved, values(model), "the checkpoint written after the failures")
    assert _orbax_noise(caplog, capfd) == []


def test_a_full_disk_at_the_emergency_checkpoint_names_the_newest_one_on_disk(disk, caplog, capfd):
    """Ctrl-C after step 3 with the disk full: the emergency save fails in one line and the
    interruption points at step 2's checkpoint to resume from."""
    directory = str(disk / "checkpoints")
    lines, record = [], SignalRecord()
    with Checkpoints(directory, keep=None, data=DATA) as checkpoints:
        saver = PeriodicCheckpoint(checkpoints, every=2, steps_per_epoch=STEPS_PER_EPOCH, report=lines.append)
        filler = DiskFiller(disk, fill_after=(3,), signal_after=3, record=record)
        callbacks = [filler, saver, StopAtSignal(record, saver)]
        with pytest.raises(TrainingInterrupted) as stopped:
            fit_from(_sharded_model(), ResumableBatches(batches()), epochs=1, callbacks=callbacks, verbose=0)
    assert lines == [
        f"zoo: checkpoint 3 not saved to {directory}: No space left on device (ENOSPC); "
        f"the last good checkpoint is {directory}/2; stopping"
    ]
    assert (stopped.value.step, stopped.value.checkpoint, stopped.value.saved) == (3, f"{directory}/2", False)
    assert stopped.value.describe("zoo train cnn --resume") == (
        f"interrupted by SIGINT at step 3; its checkpoint could not be written, the newest is {directory}/2; "
        "resume from it with: zoo train cnn --resume"
    )
    assert _orbax_noise(caplog, capfd) == []


def test_a_callback_on_a_closed_event_loop_is_dropped_and_nothing_else(monkeypatch):
    """Orbax's reads can end on their own thread after their save or restore returned,
    scheduling on a closed loop: that unraisable (from asyncio's _check_closed) is dropped
    for good, once installed; the same words raised elsewhere, and anything else, pass on."""
    import asyncio
    import sys
    import types

    from zoo.training.checkpoints import _write_failure

    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed") as closed:
        loop.call_soon_threadsafe(print)
    elsewhere = RuntimeError("Event loop is closed")  # same words, not from the loop: passed on
    other = ValueError("other")
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    _write_failure.drop_closed_loop_callbacks()
    _write_failure.drop_closed_loop_callbacks()  # once: not wrapped twice
    assert sys.unraisablehook.hook == seen.append
    for error in (closed.value, elsewhere, other):  # what Python hands the hook (sys.UnraisableHookArgs' fields)
        sys.unraisablehook(
            types.SimpleNamespace(
                exc_type=type(error), exc_value=error, exc_traceback=error.__traceback__, err_msg=None, object=None
            )
        )
    assert [args.exc_value for args in seen] == [elsewhere, other]
