"""Resume anywhere: a checkpoint written under one layout and device count resumes under
another, and the run ends where the uninterrupted run ends.

Each writer is a whole run (2 epochs of 2 steps, a checkpoint every 2 steps: after
epoch 1 and at the end), the uninterrupted reference. Its step-2 checkpoint, copied
alone into a fresh folder, is what a run interrupted after epoch 1 leaves; the reader
resumes from it under another layout and trains steps 3-4. The reader's final weights
equal the writer's within float32 reduction-order rounding: ``RTOL`` of each weight's
largest magnitude (2.2e-7 of it at most, measured at 4 blocks of T = 32), and the data
position is exact (it resumes at epoch 2, batch 0, step 2 and ends at step 4).

The GPT goes round every layout on 8 simulated devices, ``single`` being the one-device
case, ``pipeline`` the stacked-block form (``zoo/training/checkpoints/_block_forms.py``; 2 blocks
on its default mesh data=4,stage=2, so the other layouts compile 2 blocks, not 4);
the CNN round its layouts; two readers run in their own process on 4 devices.
Tier 1 keeps data -> pipeline (the form change); the rest, the CNN's pairs too, is tier 2
(tests/_tiers.py).
"""

import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from zoo.training.checkpoints import Checkpoints

RTOL = 1e-5  # of a weight's largest magnitude
RESUMED = "resumed from {}: epoch 2, batch 0, step 2"
GPT_RUN = {
    "config_name": "gpt_tiny",
    "num_layers": 2,  # the pipeline: 2 stages (data=4,stage=2, the default mesh for 2 layers)
    "sequence_length": 64,
    "batch_size": 8,
    "steps_per_epoch": 2,
    "epochs": 2,
    "seed": 3,
    "checkpoint_every": 2,
    "keep": 10,
}
CNN_RUN = {
    "dataset": "shapes",
    "image_size": 16,
    "train_examples": 32,
    "batch_size": 16,
    "epochs": 2,
    "seed": 3,
    "checkpoint_every": 2,
    "keep": 10,
}
GPT_LAYOUTS = ("single", "data", "fsdp", "tp", "tp+sp", "context", "pipeline")
GPT_PAIRS = list(zip(GPT_LAYOUTS, GPT_LAYOUTS[1:] + GPT_LAYOUTS[:1], strict=True))  # each layout writes and reads once
CNN_PAIRS = [("data", "model"), ("model", "single"), ("single", "data")]


def _train(job, run, directory, output, **settings):
    """One run of ``zoo train <job>`` in this process; returns (its model, its report lines)."""
    if job == "gpt":
        from zoo.training.gpt import GPTTrainSettings as Settings
        from zoo.training.gpt import train
    else:
        from zoo.config.settings import CNNTrainSettings as Settings
        from zoo.training.cnn import train
    lines = []
    try:
        result = train(
            Settings(**run, **settings, checkpoint_dir=str(directory), output=str(output)), report=lines.append
        )
    finally:
        keras.distribution.set_distribution(None)  # train leaves its distribution set, as fit needs it
    model = result["model"] if isinstance(result, dict) else keras.saving.load_model(output)
    return model, lines


class Writers:
    """Each (job, layout)'s uninterrupted run, made once: its final weights and its folder."""

    def __init__(self, root):
        self.root = root
        self.runs = {}

    def __call__(self, job, layout):
        if (job, layout) not in self.runs:
            name = f"{job}-{layout}".replace("+", "_")
            run = GPT_RUN if job == "gpt" else CNN_RUN
            model, _ = _train(job, run, self.root / name, self.root / f"{name}.keras", layout=layout)
            self.runs[job, layout] = (self.root / name, _layer_form(model))
        return self.runs[job, layout]


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    return Writers(tmp_path_factory.mktemp("writers"))


def _interrupted_copy(directory, target):
    """A folder holding only the writer's step-2 checkpoint: the run stopped after epoch 1."""
    assert Checkpoints(str(directory)).steps() == [2, 4], os.listdir(directory)
    os.makedirs(target)
    shutil.copytree(directory / "2", target / "2")
    return target


def _layer_form(model):
    """``{path: weight}`` with a stacked ``blocks/<rest>`` (R, L/R, ...) as ``block_<l>/<rest>``."""
    weights = {}
    for variable in model.weights:
        value = np.asarray(variable.value)
        if variable.path.startswith("blocks/"):
            for layer, block in enumerate(value.reshape(-1, *value.shape[2:])):
                weights[f"block_{layer}/{variable.path.removeprefix('blocks/')}"] = block
        else:
            weights[variable.path] = value
    return weights


def _assert_same_weights(resumed, uninterrupted):
    assert sorted(resumed) == sorted(uninterrupted)
    for path, expected in uninterrupted.items():
        scale = float(np.max(np.abs(expected))) or 1.0
        np.testing.assert_allclose(resumed[path], expected, rtol=0, atol=RTOL * scale, err_msg=path)


def _check_resume(job, writers, tmp_path, written, resumed_layout):
    directory, uninterrupted = writers(job, written)
    target = _interrupted_copy(directory, tmp_path / "resumed")
    run = GPT_RUN if job == "gpt" else CNN_RUN
    model, lines = _train(job, run, target, tmp_path / "resumed.keras", layout=resumed_layout, resume=True)
    assert RESUMED.format(target / "2") in lines, lines
    assert int(model.optimizer.iterations) == 4
    _assert_same_weights(_layer_form(model), uninterrupted)


@pytest.mark.parametrize(("written", "resumed"), GPT_PAIRS, ids=[f"{a}-to-{b}" for a, b in GPT_PAIRS])
def test_a_gpt_checkpoint_resumes_under_another_layout(writers, tmp_path, written, resumed):
    _check_resume("gpt", writers, tmp_path, written, resumed)


def test_the_pipelines_stacked_blocks_resume_as_layers_and_back(writers, tmp_path):
    """The form change both ways, data -> pipeline being the GPT_PAIRS case kept in tier 1."""
    _check_resume("gpt", writers, tmp_path, "data", "pipeline")


@pytest.mark.parametrize(("written", "resumed"), CNN_PAIRS, ids=[f"{a}-to-{b}" for a, b in CNN_PAIRS])
def test_a_cnn_checkpoint_resumes_under_another_layout(writers, tmp_path, written, resumed):
    _check_resume("cnn", writers, tmp_path, written, resumed)


def _cli_on_4_devices(job, run, target, output, layout):
    flags = []
    for key, value in {**run, "layout": layout, "checkpoint_dir": target, "output": output}.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    env["JAX_PLATFORMS"] = "cpu"
    command = [sys.executable, "-m", "zoo", "train", job, *flags, "--resume", "--simulate-devices", "4"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(("job", "written", "resumed"), [("gpt", "tp", "fsdp"), ("cnn", "model", "model")])
def test_a_checkpoint_of_8_devices_resumes_on_4(writers, tmp_path, job, written, resumed):
    directory, uninterrupted = writers(job, written)
    target = _interrupted_copy(directory, tmp_path / "resumed")
    run = GPT_RUN if job == "gpt" else CNN_RUN
    result = _cli_on_4_devices(job, run, target, tmp_path / "resumed.keras", resumed)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "devices: 4 x cpu" in result.stdout
    assert RESUMED.format(target / "2") in result.stdout
    model = keras.saving.load_model(tmp_path / "resumed.keras", safe_mode=True)
    _assert_same_weights(_layer_form(model), uninterrupted)
