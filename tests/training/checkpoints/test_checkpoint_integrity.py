"""Nothing lost, nothing ignored: damaged bytes in any checkpoint file, non-finite weights,
a second run on the same folder, and an output path that cannot be written.

All in-process on the tiny SmallCNN of ``_tiny.py``; one model is built and compiled per
test and every resume restores into it (a restore replaces weights, optimizer state and
the dropout RNG), so each file's case costs a restore and a few steps, not a compile.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.training._tiny import (
    BATCH,
    EXAMPLES,
    assert_bitwise_equal,
    batches,
    build,
    values,
)
from zoo.training._checkpointed_fit import open_checkpoints
from zoo.training.callbacks import PeriodicCheckpoint
from zoo.training.checkpoints import (
    CheckpointError,
    Checkpoints,
    ResumableBatches,
    TrainingPosition,
    fit_from,
)
from zoo.training.checkpoints._lock import CheckpointLock
from zoo.training.cnn import CNNTrainSettings, train
from zoo.training.paths import ModelSaveError, PathError, save_model_atomically, write_or_rescue

DATA = {"examples": EXAMPLES, "batch_size": BATCH, "seed": 0}
STEPS_PER_EPOCH = EXAMPLES // BATCH  # 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """8 steps of fit saving every 2, all kept: (directory with steps 2, 4, 6; final values; model).

    Step 8 is removed, so the newest checkpoint is step 6 and a resume has steps left."""
    directory = tmp_path_factory.mktemp("run") / "checkpoints"
    model = build()
    with Checkpoints(str(directory), keep=None, data=DATA) as checkpoints:
        saver = PeriodicCheckpoint(checkpoints, every=2, steps_per_epoch=STEPS_PER_EPOCH)
        fit_from(model, ResumableBatches(batches()), epochs=2, callbacks=[saver], verbose=0)
    shutil.rmtree(directory / "8")
    return directory, values(model), model


def _resume_and_finish(directory, model, warnings_seen):
    """Resume from the newest usable checkpoint in ``directory`` and train to the end of epoch 2."""
    checkpoints = Checkpoints(str(directory), keep=None, data=DATA)
    reports = []
    with pytest.warns() as caught:
        position = checkpoints.resume(model, report=reports.append)
    warnings_seen.extend(str(w.message) for w in caught if "checkpoint" in str(w.message))
    fit_from(model, ResumableBatches(batches(), epoch=position.epoch, start_batch=position.batch), epochs=2, verbose=0)
    return position, reports


def _flip(path, count=16):
    """XOR ``count`` bytes in the middle of ``path`` with 0xFF (the whole file if smaller)."""
    content = bytearray(pathlib.Path(path).read_bytes())
    start = max(0, len(content) // 2 - count // 2)
    for index in range(start, min(len(content), start + count)):
        content[index] ^= 0xFF
    pathlib.Path(path).write_bytes(bytes(content))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # Orbax's abandoned read coroutines
def test_flipped_bytes_in_any_file_fall_back_and_finish_bitwise_equal(run, tmp_path):
    """Flip 16 bytes in each file of the newest checkpoint in turn: resume either refuses it
    (one warning naming the checkpoint, moved to quarantine/) and falls back to step 4, or
    (bytes no reader uses) restores it exactly; either way the finished run equals the
    uninterrupted one bitwise."""
    directory, expected, model = run
    newest = directory / "6"
    files = sorted(p for p in newest.rglob("*") if p.is_file())
    assert len(files) >= 6, files
    refused = []
    for file in files:
        relative = file.relative_to(newest)
        copy = tmp_path / str(relative).replace("/", "_")
        shutil.copytree(directory, copy)
        _flip(copy / "6" / relative)
        warned = []
        position, reports = _resume_and_finish(copy, model, warned)
        assert_bitwise_equal(values(model), expected, f"finished after damage to {relative}")
        if position.step == 4:
            refused.append(str(relative))
            assert len(warned) == 1 and f"checkpoint {copy}/6:" in warned[0], warned
            assert (copy / "quarantine" / "6").is_dir() and not (copy / "6").exists()
        else:
            assert position.step == 6 and not warned, (relative, warned)
    print("refused after damage:", refused)
    assert "zoo/checkpoint.json" in refused  # damage that still parses is found by the metadata's checksum
    assert "state/manifest.ocdbt" in refused
    assert any(name.startswith("state/d/") for name in refused)  # the array data itself


def test_no_flipped_bit_restores_other_values(run, tmp_path):
    """The issue's silent case: one bit flipped in the zstd-compressed array chunks often
    decodes without error, to other numbers (a change of ~1e-7). Each flip is now refused,
    or (a chunk no reader uses) restores exactly the saved values."""
    directory, _, model = run
    _, saved = Checkpoints(str(directory), data=DATA).read(str(directory / "6"))
    chunks = [p.relative_to(directory) for p in sorted((directory / "6" / "state").rglob("*")) if _is_zstd(p)]
    assert chunks
    problems = []
    for number, relative in enumerate(chunks):
        size = (directory / relative).stat().st_size
        for position in (size // 3, size // 2, 2 * size // 3):
            copy = tmp_path / f"{number}-{position}"  # a new path each time: TensorStore caches what it read
            shutil.copytree(directory, copy)
            content = bytearray((copy / relative).read_bytes())
            content[position] ^= 0x01
            (copy / relative).write_bytes(bytes(content))
            try:
                _, restored = Checkpoints(str(copy), data=DATA).read(str(copy / "6"))
            except CheckpointError as error:
                problems.append(error.problem)
            else:
                assert_bitwise_equal(restored, saved, f"bit {position * 8} of {relative} flipped")
    pattern = r"(model|optimizer) variable \d+ \(.+\) does not match the checksum recorded at save: its array data in state/ is damaged"
    assert any(re.fullmatch(pattern, problem) for problem in problems), problems


def test_arrays_that_read_well_but_are_not_the_saved_ones_are_named(run, tmp_path):
    """Step 4's valid arrays under step 6's metadata: nothing fails to read, the checksums refuse."""
    directory, _, model = run
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    shutil.rmtree(copy / "6" / "state")
    shutil.copytree(copy / "4" / "state", copy / "6" / "state")
    with pytest.raises(
        CheckpointError, match=r"/6: model variable 0 \(.*kernel\) does not match the checksum recorded at save"
    ):
        Checkpoints(str(copy), data=DATA).restore(model, str(copy / "6"))


def test_a_changed_digit_in_the_metadata_is_found(run, tmp_path):
    directory, _, model = run
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    metadata = copy / "6" / "zoo" / "checkpoint.json"
    metadata.write_text(metadata.read_text().replace('"epoch": 1', '"epoch": 0'))  # still valid JSON
    with pytest.raises(
        CheckpointError, match="the metadata file zoo/checkpoint.json does not match its own checksum: it is damaged"
    ):
        Checkpoints(str(copy), data=DATA).restore(model, str(copy / "6"))


def _is_zstd(path):
    return path.is_file() and path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"


def test_a_checkpoint_with_non_finite_weights_is_refused(tmp_path):
    model = build()
    with Checkpoints(str(tmp_path), data=DATA) as checkpoints:
        for step in (2, 4):
            if step == 4:
                kernel = model.trainable_variables[0]
                kernel.assign(np.full(kernel.shape, np.nan, kernel.dtype))
            model.optimizer.iterations.assign(step)
            checkpoints.save(model, TrainingPosition.after(step, STEPS_PER_EPOCH))
    checkpoints = Checkpoints(str(tmp_path), data=DATA)
    with pytest.warns(UserWarning, match=r"/4: model variable 0 \(.*kernel\) holds NaN or infinite values"):
        assert checkpoints.resume(model, report=lambda line: None).step == 2
    assert np.all(np.isfinite(np.asarray(model.trainable_variables[0].value)))


LOCK_HOLDER = """
import fcntl, json, os, socket, sys
handle = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(handle, fcntl.LOCK_EX)
os.write(handle, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": "now"}).encode())
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_run_on_a_locked_folder_is_refused_and_damages_nothing(run, tmp_path):
    """Another process holds ``zoo.lock``: the run is refused naming it; its checkpoints are untouched."""
    directory, _, model = run
    folder = tmp_path / "checkpoints"
    shutil.copytree(directory, folder)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(folder / "zoo.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        config = CNNTrainSettings(checkpoint_dir=str(folder), resume=True, keep=1)
        with pytest.raises(
            CheckpointError,
            match=rf"{folder}: is in use by another run \(process {holder.pid} on .* since now\); wait for it",
        ):
            open_checkpoints(config, DATA, model, report=print)
    finally:
        holder.communicate("")
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "zoo.lock"}
    assert after == {
        p: c for p, c in before.items() if p.name != "zoo.lock"
    }  # keep=1 deleted nothing, nothing quarantined

    # the holder is gone (its flock with it): the next run takes the folder over and says whose lock it was
    lines = []
    checkpoints, position = open_checkpoints(config, DATA, model, report=lines.append)
    checkpoints.close()
    assert position.step == 6
    assert any(f"took over the lock a stopped run left (process {holder.pid} on" in line for line in lines), lines


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    """``zoo.lock`` linked to another file (or to nothing): refused in one line naming it, the target
    neither truncated nor created (the lock is opened with ``O_NOFOLLOW``)."""
    target = tmp_path / "precious.txt"
    target.write_text("do not truncate me\n")
    for name, points_to in [("live", target), ("dangling", tmp_path / "absent.txt")]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "zoo.lock").symlink_to(points_to)
        lock = CheckpointLock(str(folder))
        with pytest.raises(CheckpointError) as caught:
            lock.acquire()
        message = str(caught.value)
        assert "\n" not in message
        assert re.fullmatch(
            rf"checkpoint {re.escape(str(folder / 'zoo.lock'))}: "
            rf"is a symbolic link \(to '{re.escape(str(points_to))}'\), not a lock file; "
            r"nothing was written through it: "
            r"remove the link or choose another --checkpoint-dir",
            message,
        ), message
        lock.release()  # nothing held: a no-op
    assert target.read_text() == "do not truncate me\n"
    assert not (tmp_path / "absent.txt").exists()


def test_an_unwritable_output_is_refused_before_any_work(tmp_path):
    (tmp_path / "a-file").write_text("")
    cases = [
        (
            CNNTrainSettings(output=str(tmp_path / "a-file" / "m.keras")),
            rf"--output '{tmp_path}/a-file/m.keras': cannot be written: {tmp_path}/a-file is a file, not a folder",
        ),
        (
            CNNTrainSettings(output=str(tmp_path / "m.keras"), checkpoint_dir=str(tmp_path / "a-file" / "c")),
            r"--checkpoint-dir .*a-file is a file, not a folder",
        ),
        (
            CNNTrainSettings(output=str(tmp_path / "m.keras"), data_dir=str(tmp_path / "a-file")),
            r"--data-dir .*a-file is a file, not a folder",
        ),
    ]
    if _unwritable("/sys"):  # a read-only folder even for root (chmod does not stop root)
        cases.append(
            (
                CNNTrainSettings(output="/sys/m.keras"),
                r"--output '/sys/m.keras': cannot be written: /sys is not writable",
            )
        )
    for config, message in cases:
        lines = []
        with pytest.raises(PathError, match=message):
            train(config, report=lines.append)
        assert lines == []  # refused before the first line of work


def _unwritable(folder):
    try:
        handle = os.open(os.path.join(folder, "zoo-write-test"), os.O_CREAT | os.O_WRONLY)
    except OSError:
        return True
    os.close(handle)
    os.remove(os.path.join(folder, "zoo-write-test"))
    return False


def test_a_failing_save_rescues_the_model_and_says_where(tmp_path):
    model = build()
    (tmp_path / "gone").write_text("")  # the output folder became a file after the start
    with pytest.raises(
        ModelSaveError,
        match=r"could not write the model to .*/gone/m.keras \(.*\); the trained model was saved to (.*) instead",
    ) as caught:
        save_model_atomically(
            model, str(tmp_path / "gone" / "m.keras"), fallback_folders=[str(tmp_path / "checkpoints")]
        )
    rescued = caught.value.rescued
    assert os.path.dirname(rescued) == str(tmp_path / "checkpoints") and rescued.endswith("-m.keras")
    import keras

    reloaded = keras.saving.load_model(rescued)
    for saved, loaded in zip(model.variables, reloaded.variables, strict=True):
        assert np.array_equal(np.asarray(saved.value), np.asarray(loaded.value)), saved.path


def test_a_safetensors_write_failing_on_a_full_disk_is_rescued_like_an_os_error(tmp_path):
    """safetensors raises ``SafetensorError`` (not an ``OSError``) when the disk fills: the
    fine-tuned preset is still written to the fallback folder and the error names both paths."""
    from safetensors import SafetensorError

    output, fallback = tmp_path / "full-disk" / "preset", tmp_path / "checkpoints"
    fallback.mkdir()

    def save(target):
        if target == str(output):
            raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")
        os.makedirs(target)
        (pathlib.Path(target) / "model.safetensors").write_bytes(b"weights")
        return target

    with pytest.raises(
        ModelSaveError,
        match=rf"could not write the model to {re.escape(str(output))} "
        r"\(SafetensorError: .*No space left on device.*\); "
        rf"the trained model was saved to {re.escape(str(fallback))}/rescued-\d{{8}}-\d{{6}}-preset instead",
    ) as caught:
        write_or_rescue(save, str(output), fallback_folders=[str(fallback)])
    assert (pathlib.Path(caught.value.rescued) / "model.safetensors").read_bytes() == b"weights"
