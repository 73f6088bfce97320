"""The cpu-sim-8 recipes run end to end in-process on the 8 simulated devices (shrunk by
overrides to a few steps), and ``run_recipe`` refuses the wrong machine."""

import math

import pytest

from tests.recipes._recipes import CPU, RECIPES, ids
from zoo.training.recipes import RecipeError, load_recipe, run_recipe

# Overrides that keep each run to a few steps, the pre-training GPTs at one block (the recipes
# themselves run ~1 min each; every key of the file still maps onto the job: job_config()).
SHRINK = {
    "train_cnn.toml": {"train.epochs": 1, "data.train_examples": 256},
    "pretrain_gpt.toml": {"train.steps_per_epoch": 4, "model.num_layers": 1},
    "pretrain_moe.toml": {"train.steps_per_epoch": 4, "model.num_layers": 1},
    "finetune.toml": {"train.epochs": 1, "data.train_examples": 256, "data.test_examples": 64},
}


def _load_shrunk(path, tmp_path):
    output = tmp_path / ("preset" if path.name == "finetune.toml" else "model.keras")
    overrides = {**SHRINK[path.name], "train.output": str(output)}
    if "checkpoint.checkpoint_dir" in load_recipe(path).given:
        overrides["checkpoint.checkpoint_dir"] = str(tmp_path / "checkpoints")
    return load_recipe(path, overrides), output


def _run_and_check(recipe, output):
    lines = []
    result = run_recipe(recipe, report=lines.append)
    assert lines[0].startswith(f"recipe: {recipe.path}") and any(line.startswith("layout: ") for line in lines)
    assert output.exists(), f"{recipe.path}: no model at {output}"
    losses = result["history"]["loss"]
    assert losses and all(math.isfinite(loss) for loss in losses)
    return result


@pytest.mark.parametrize("path", CPU, ids=ids(CPU))
def test_cpu_recipe_runs_end_to_end(path, tmp_path):
    recipe, output = _load_shrunk(path, tmp_path)
    recipe.job_config()  # every key of the file maps onto the job's config
    _run_and_check(recipe, output)
    if recipe.checkpoint.checkpoint_dir:
        assert any((tmp_path / "checkpoints").iterdir()), "checkpointing was configured but nothing was saved"


def test_run_refuses_a_recipe_for_other_devices():
    with pytest.raises(
        RecipeError,
        match=r"gpu-8/train_cnn.toml: \[target\] platform is 'gpu' but JAX found 8 cpu device\(s\) in 1 process",
    ):
        run_recipe(load_recipe(RECIPES / "gpu-8" / "train_cnn.toml"))
    recipe = load_recipe(RECIPES / "cpu-sim-8" / "train_cnn.toml", {"target.devices_per_host": 4})
    with pytest.raises(
        RecipeError, match=r"\[target\] hosts=1 x devices_per_host=4 = 4 devices, but JAX found 8 cpu device"
    ):
        run_recipe(recipe)


def test_run_joins_the_hosts_the_recipe_names(monkeypatch):
    """Arguments handed to multihost.initialize: the host count from the file, the
    coordinator from the flag before the file, all local GPUs for one process per host."""
    from zoo.distribution import multihost

    calls = []

    def initialize(*args, **kwargs):
        calls.append((args, kwargs))
        raise multihost.MultihostError("stop here")

    monkeypatch.setattr(multihost, "initialize", initialize)
    recipe = load_recipe(RECIPES / "gpu-multihost" / "pretrain_gpt.toml", {"multihost.coordinator_address": "file:1"})
    with pytest.raises(multihost.MultihostError, match="stop here"):
        run_recipe(recipe, coordinator_address="flag:2", process_id=3)
    assert calls == [(("flag:2", 4, 3), {"timeout_s": 600.0, "local_device_ids": list(range(8))})]
    with pytest.raises(multihost.MultihostError):
        run_recipe(load_recipe(RECIPES / "tpu-multihost" / "pretrain_gpt.toml"))
    assert calls[1] == ((None, 16, None), {"timeout_s": 600.0, "local_device_ids": None})  # TPU: JAX picks the chips
