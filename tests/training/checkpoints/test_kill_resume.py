"""Acceptance: a training process SIGKILLed in the middle of committing a checkpoint, or
stopped by SIGTERM (preemption; SIGINT, Ctrl-C, takes the same handler) at a random step,
resumes with ``--resume`` to final weights and optimizer state bitwise equal to an
uninterrupted run, and no kill leaves a checkpoint that loads but is wrong.

Each run is ``zoo train cnn`` in its own process (``_train_worker.py``) under
DataParallel on 8 simulated CPU devices, on the embedded shapes dataset at 16x16: 48
images in batches of 16, 3 steps per epoch, with dropout so the RNG state matters. (The
same resume on one device is tested in-process in ``test_checkpoints.py``.) Runs share the
test session's JAX compilation cache (conftest.py; same programs, so the same
executables: the resumed runs then skip most of their compile time).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.training._tiny import assert_bitwise_equal
from zoo.data import load
from zoo.training.checkpoints import Checkpoints

ROOT = pathlib.Path(__file__).resolve().parents[3]
WORKER = pathlib.Path(__file__).resolve().parents[1] / "_train_worker.py"
RUN = {"dataset": "shapes", "image_size": 16, "train_examples": 48, "batch_size": 16, "dropout": 0.25, "seed": 3}
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def shapes_prepared():
    """The dataset prepared once, before any worker process (which find it in ZOO_DATA_DIR)."""
    load("shapes", "train", image_size=16, num_examples=1)


def _run(config, devices, *kill):
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1"
    )  # the session's compilation cache too
    flags = [flag for flag in env.get("XLA_FLAGS", "").split() if "device_count" not in flag]
    env["XLA_FLAGS"] = " ".join(flags + ([f"--xla_force_host_platform_device_count={devices}"] if devices > 1 else []))
    command = [sys.executable, str(WORKER), json.dumps(config), *kill]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _finished(result):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def _killed(result, message):
    assert result.returncode == KILLED, (
        f"expected SIGKILL, got {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    )
    assert message in result.stdout
    return result.stdout


def _reference(tmp_path, **options):
    """The uninterrupted run, checkpointing every step: ``{step: values}`` and its saved model.

    Run in this process (8 simulated devices too, the same programs): a subprocess less."""
    from zoo.training.cnn import CNNTrainSettings, train

    directory = tmp_path / "reference"
    config = {
        **RUN,
        **options,
        "checkpoint_dir": str(directory),
        "checkpoint_every": 1,
        "keep": 100,
        "output": str(tmp_path / "reference.keras"),
    }
    train(CNNTrainSettings(**config), report=lambda line: None)
    keras.distribution.set_distribution(None)  # train leaves its distribution set, as fit needs it
    checkpoints = Checkpoints(str(directory))
    return {step: checkpoints.read(os.path.join(directory, str(step)))[1] for step in checkpoints.steps()}


def _assert_every_complete_checkpoint_is_right(directory, reference):
    """What a resume could load is exactly the uninterrupted run's state at that step."""
    checkpoints = Checkpoints(str(directory))
    assert checkpoints.steps(), f"no complete checkpoint in {directory}"
    for step in checkpoints.steps():
        assert_bitwise_equal(
            checkpoints.read(os.path.join(directory, str(step)))[1], reference[step], f"checkpoint {step}"
        )
    return checkpoints


def _assert_same_saved_model(tmp_path):
    runs = [keras.saving.load_model(tmp_path / name, safe_mode=True) for name in ("reference.keras", "resumed.keras")]
    for expected, actual in zip(runs[0].variables, runs[1].variables, strict=True):
        assert np.array_equal(np.asarray(actual.value), np.asarray(expected.value)), actual.path


def _interrupted(result, signal_number, step, directory):
    """Exit 128 + N, and one line on stderr naming the step, the checkpoint and the resume command."""
    expected = 128 + signal_number
    assert result.returncode == expected, (
        f"expected exit {expected}, got {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("zoo:")]
    name = signal.Signals(signal_number).name
    prefix = f"zoo: interrupted by {name} at step {step}; checkpoint saved to {directory / str(step)}; resume with: zoo train cnn "
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr[-3000:]
    assert "--resume" in lines[0][len(prefix) :].split()  # the command to resume with, as run
    assert "Traceback" not in result.stderr
    return result.stdout


def test_data_parallel_run_preempted_and_killed_resumes_bitwise(tmp_path, shapes_prepared):
    """DataParallel on 8 simulated devices, 4 epochs of 3 steps; checkpoints every 2 steps, keep 2.

    One run, stopped two ways in turn: SIGTERM (a scheduler's preemption notice) after a
    random step, then SIGKILL in the middle of committing a checkpoint (losing the steps
    since the previous one, which the resume redoes); each resume goes on from the newest
    usable checkpoint, and the end is bitwise the uninterrupted run. (SIGINT goes through
    the same handler: tests/training/test_interrupts.py raises both in-process.)"""
    sigterm_step = int(np.random.default_rng().choice([5, 7]))  # mid-epoch: batch 2 of epoch 2, batch 1 of epoch 3
    reference = _reference(tmp_path, layout="data", epochs=4)  # 12 steps
    directory = tmp_path / "checkpoints"
    config = {
        **RUN,
        "layout": "data",
        "epochs": 4,
        "checkpoint_dir": str(directory),
        "checkpoint_every": 2,
        "keep": 2,
        "resume": True,
        "output": str(tmp_path / "resumed.keras"),
    }

    # 1. SIGTERM after a random mid-epoch step: exit 143 and a checkpoint of that step
    out = _interrupted(
        _run(config, 8, "--signal-after-step", str(sigterm_step), "--signal", "TERM"),
        signal.SIGTERM,
        sigterm_step,
        directory,
    )
    assert "DataParallel on mesh" in out and "replicated" in out
    assert _assert_every_complete_checkpoint_is_right(directory, reference).latest_complete() == str(
        directory / str(sigterm_step)
    )

    # 2. resumed there; killed inside the save of step 8, all of it written, before the commit rename
    out = _killed(_run(config, 8, "--kill-at-commit", "8"), "SIGKILL while committing")
    epoch, batch = divmod(sigterm_step, 3)
    assert f"resumed from {directory / str(sigterm_step)}: epoch {epoch + 1}, batch {batch}, step {sigterm_step}" in out
    assert os.path.isfile(directory / "8.orbax-checkpoint-tmp" / "commit_success.txt")  # everything but the rename
    assert not os.path.exists(directory / "8")
    newest = max(sigterm_step, 6)  # step 6's periodic checkpoint, unless the emergency one was later
    assert _assert_every_complete_checkpoint_is_right(directory, reference).latest_complete() == str(
        directory / str(newest)
    )

    # 3. resumed there (steps up to 8 done again); runs to the end
    out = _finished(_run(config, 8))
    assert f"resumed from {directory / str(newest)}" in out
    assert "8.orbax-checkpoint-tmp" not in os.listdir(directory)  # the interrupted write was cleaned up
    checkpoints = _assert_every_complete_checkpoint_is_right(directory, reference)
    assert checkpoints.steps()[-1] == 12, sigterm_step  # 12: final weights and optimizer state bitwise equal
    _assert_same_saved_model(tmp_path)


def test_a_new_run_refuses_a_directory_that_holds_checkpoints(tmp_path):
    from zoo.training.checkpoints import CheckpointError
    from zoo.training.cnn import CNNTrainSettings, train

    os.makedirs(tmp_path / "7")
    config = CNNTrainSettings(**RUN, layout="single", checkpoint_dir=str(tmp_path), output=str(tmp_path / "m.keras"))
    with pytest.raises(CheckpointError, match=r"already holds checkpoints \(steps 7\); pass --resume"):
        train(config, report=lambda line: None)
    with pytest.raises(ValueError, match="resume continues from checkpoint_dir: give --checkpoint-dir"):
        train(CNNTrainSettings(resume=True), report=lambda line: None)
